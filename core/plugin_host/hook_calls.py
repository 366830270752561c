"""Calling hooks through pluggy: one plain implementation per call, inside every wrapper.

torchkiln never calls a hook implementation's function itself. Each call goes through pluggy's
hook execution, so ``@hookimpl(wrapper=True)`` and ``@hookimpl(hookwrapper=True)``
implementations wrap it, and pluggy's tracing and ``TORCHKILN_TRACE_PLUGINS=1`` see it.

A call runs exactly one plain (non-wrapper) implementation, because torchkiln needs to know
whose result is whose: a declared name belongs to the plugin that declared it, a configuration
override is credited to its plugin, a bad preparation names its plugin, and a declared name is
served by its plugin only. pluggy's own ``pm.hook.<name>()`` returns a list that does not say
who returned what. With one implementation per call, the call is made with pluggy's
``firstresult`` semantics: a wrapper's result is that implementation's return value, the type
the hook's docstring gives (not a list).

pluggy has no public call with a chosen list of implementations; :func:`call_implementation`
uses pluggy's own hook execution through the adapter (``torchkiln._internals.pluggy_calls``).
"""

from __future__ import annotations

from collections.abc import Callable
from types import CodeType
from typing import Any

import pluggy
from pluggy import HookImpl

from torchkiln._internals.pluggy_calls import execute_hook

PLAIN_OPTIONS: pluggy.HookimplOpts = {
    "wrapper": False,
    "hookwrapper": False,
    "optionalhook": False,
    "tryfirst": False,
    "trylast": False,
    "specname": None,
}
"""The options of an implementation torchkiln adds to one call (a backend's own compile)."""


def is_wrapper(impl: HookImpl) -> bool:
    """Whether ``impl`` is a new-style (``wrapper=True``) or old-style (``hookwrapper=True``)
    wrapper."""
    return bool(impl.wrapper or impl.hookwrapper)


def plain_implementations(pm: pluggy.PluginManager, hook_name: str) -> list[HookImpl]:
    """The non-wrapper implementations of ``hook_name``, in pluggy's call order (the plugin
    registered last, or ``tryfirst``, first)."""
    impls = getattr(pm.hook, hook_name).get_hookimpls()
    return [impl for impl in reversed(impls) if not is_wrapper(impl)]


def plain_implementation(
    pm: pluggy.PluginManager, hook_name: str, plugin_name: str
) -> HookImpl | None:
    """``plugin_name``'s non-wrapper implementation of ``hook_name``, if it has one."""
    impls = plain_implementations(pm, hook_name)
    return next((impl for impl in impls if impl.plugin_name == plugin_name), None)


def call_implementation(
    pm: pluggy.PluginManager, hook_name: str, impl: HookImpl, **kwargs: Any
) -> Any:
    """``impl``'s result for ``kwargs``, ``impl`` called inside every wrapper of ``hook_name``
    (in pluggy's order) by pluggy's hook execution; a wrapper may change the result."""
    wrappers = [i for i in getattr(pm.hook, hook_name).get_hookimpls() if is_wrapper(i)]
    # pluggy's order: plain implementations first, then wrappers; the last is called first.
    # firstresult: with one implementation, a wrapper gets its result itself, not a list of one.
    return execute_hook(pm, hook_name, [impl, *wrappers], kwargs, firstresult=True)


ADDED_CODES: set[CodeType] = set()
"""The code of every function an :func:`added_implementation` runs: an error raised under one
is that implementation's (its plugin's), not a wrapper's it passed through."""


def added_implementation(plugin_name: str, function: Callable[..., Any]) -> HookImpl:
    """An implementation that takes part in one call only, credited to ``plugin_name`` (as
    pluggy's ``HookCaller.call_extra`` makes them): a backend's own compile."""
    code = getattr(getattr(function, "__func__", function), "__code__", None)
    if code is not None:
        ADDED_CODES.add(code)  # one per function definition, however many calls
    return HookImpl(None, plugin_name, function, PLAIN_OPTIONS)
