"""Attribute a plugin's fault to the plugin and the hook.

A hook implementation that raises, or returns something of the wrong type, must surface as a
:class:`~torchkiln.PluginError` naming the plugin and the hook, never as a bare
``AttributeError`` deep inside torchkiln. Which implementation raised is read from the
exception's traceback (the frame of an implementation's function), so this holds however the
hook was dispatched; which one returned a bad value is the plugin that declared the name the
call was for (the backend, the selector, the strategy).
"""

from __future__ import annotations

from types import CodeType
from typing import Any

from torchkiln.errors import PluginError, TorchkilnError


def _code(function: Any) -> CodeType | None:
    function = getattr(function, "__func__", function)
    return getattr(function, "__code__", None)


def plugin_at_fault(pm: Any, hook_name: str, error: BaseException) -> str | None:
    """The plugin whose ``hook_name`` implementation ``error`` was raised in (the outermost
    one on the traceback), else ``None``."""
    codes = {}
    for impl in getattr(pm.hook, hook_name).get_hookimpls():
        code = _code(impl.function)
        if code is not None:
            codes[code] = impl.plugin_name
    traceback = error.__traceback__
    while traceback is not None:
        name = codes.get(traceback.tb_frame.f_code)
        if name is not None:
            return name
        traceback = traceback.tb_next
    return None


def raised_in(pm: Any, hook_name: str, error: Exception, owner: str | None = None) -> PluginError:
    """The :class:`PluginError` for ``error`` raised by a ``hook_name`` implementation."""
    plugin = plugin_at_fault(pm, hook_name, error) or owner
    who = f"plugin {plugin!r}" if plugin else "a plugin"
    return PluginError(
        f"{who} raised in {hook_name}(): {type(error).__name__}: {error}",
        plugin=plugin,
        hook=hook_name,
    )


def call_hook(pm: Any, hook_name: str, owner: str | None = None, **kwargs: Any) -> Any:
    """``pm.<hook_name>(**kwargs)`` (the manager's dispatch to the declaring plugin); a
    non-torchkiln exception becomes a :class:`PluginError` naming the implementation it was
    raised in (else ``owner``)."""
    dispatch = getattr(pm, hook_name)
    try:
        return dispatch(**kwargs)
    except TorchkilnError:
        raise
    except Exception as error:
        raise raised_in(pm, hook_name, error, owner) from error


SHOWN_LIMIT = 80
"""The most characters of a value's repr an error message shows."""


def shown(value: Any, limit: int = SHOWN_LIMIT) -> str:
    """``repr(value)`` on one line, at most ``limit`` characters: a longer one is cut after a
    whole token (at a space, comma or bracket) and ends with ``...``."""
    text = " ".join(repr(value).split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 3]
    boundary = max(cut.rfind(c) for c in " ,([{=")
    return (cut[: boundary + 1] if boundary > limit // 2 else cut).rstrip() + "..."


def bad_result(hook_name: str, plugin: str | None, got: Any, expected: str) -> PluginError:
    """The :class:`PluginError` for a hook result of the wrong type."""
    who = f"plugin {plugin!r}" if plugin else "a plugin"
    return PluginError(
        f"{who}: {hook_name}() returned {type(got).__name__} {shown(got)}; expected {expected}",
        plugin=plugin,
        hook=hook_name,
    )
