"""Attribute a plugin's fault to the plugin and the hook.

A hook implementation that raises, or returns something of the wrong type, must surface as a
:class:`~torchkiln.PluginError` naming the plugin and the hook, never as a bare
``AttributeError`` deep inside torchkiln. Which implementation raised is read from the
exception's traceback (the frame of an implementation's function), so this holds however the
hook was dispatched and whatever wrappers the error passed through; which one returned a bad
value is the plugin that declared the name the call was for (the backend, the selector, the
strategy).
"""

from __future__ import annotations

from types import CodeType
from typing import Any

from torchkiln.errors import PluginError, TorchkilnError
from torchkiln.plugin_host.hook_calls import ADDED_CODES, is_wrapper


def _code(function: Any) -> CodeType | None:
    function = getattr(function, "__func__", function)
    return getattr(function, "__code__", None)


def plugin_at_fault(pm: Any, hook_name: str, error: BaseException) -> str | None:
    """The plugin whose ``hook_name`` implementation ``error`` was raised in, else ``None``.

    The outermost plain implementation on the traceback is at fault (a selector that asks
    another one through ``select_with`` answers for what it asked); for an implementation
    torchkiln added to the call (a backend object's compile) that is ``None`` here: the caller
    knows the plugin that declared the backend. Only where no plain
    implementation is on the traceback is a wrapper at fault, the innermost one: a wrapper an
    implementation's error merely passed through (it is on the traceback, outside that
    implementation) is never blamed for it.
    """
    plain: dict[CodeType, str | None] = dict.fromkeys(ADDED_CODES)
    wrappers: dict[CodeType, str] = {}
    for impl in getattr(pm.hook, hook_name).get_hookimpls():
        code = _code(impl.function)
        if code is not None:
            (wrappers if is_wrapper(impl) else plain)[code] = impl.plugin_name
    frames = _frames(error)
    outermost_plain = next((code for code in frames if code in plain), None)
    if outermost_plain is not None:
        return plain[outermost_plain]
    return next((wrappers[code] for code in reversed(frames) if code in wrappers), None)


def _frames(error: BaseException) -> list[CodeType]:
    """The code of each frame on ``error``'s traceback, outermost first."""
    codes = []
    traceback = error.__traceback__
    while traceback is not None:
        codes.append(traceback.tb_frame.f_code)
        traceback = traceback.tb_next
    return codes


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
