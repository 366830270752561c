"""Serving a declared name: only the plugin that declared a backend, selector or distributed
strategy compiles, selects or wraps for it; and why a declared name cannot be served.

The functions take pluggy's manager, not torchkiln's, so this module does not import
:mod:`torchkiln.plugin_host.plugin_manager` (which imports it).
"""

from __future__ import annotations

from typing import Any

import pluggy
from pluggy import HookImpl

from torchkiln.errors import PluginError
from torchkiln.plugin_host.plugin_info import (
    DECLARATION_KINDS,
    DECLARING_HOOK,
    SERVING_HOOK,
    Declared,
)


def implementation(pm: pluggy.PluginManager, hook_name: str, plugin_name: str) -> HookImpl | None:
    """``plugin_name``'s implementation of ``hook_name``, if it has one."""
    hook = getattr(pm.hook, hook_name)
    return next((i for i in hook.get_hookimpls() if i.plugin_name == plugin_name), None)


def serve(
    pm: pluggy.PluginManager, hook_name: str, declared: Declared[Any], kind: str, **kwargs: Any
) -> Any:
    """Call ``hook_name`` of the plugin that declared ``declared`` (a ``kind``) only.

    :raises PluginError: that plugin no longer implements the hook, or returned ``None``.
    """
    impl = implementation(pm, hook_name, declared.plugin)
    if impl is None:  # unregistered since it declared (declarations are cached)
        raise PluginError(
            f"plugin {declared.plugin!r} declares {kind} {declared.spec.name!r} but does "
            f"not implement {hook_name}",
            plugin=declared.plugin,
            hook=hook_name,
        )
    # A pluggy subset caller, so pluggy's tracing and TORCHKILN_TRACE_PLUGINS see the call.
    others = [p for name, p in pm.list_name_plugin() if p is not None and name != impl.plugin_name]
    results = pm.subset_hook_caller(hook_name, remove_plugins=others)(**kwargs)
    result = results[0] if results else None
    if result is None:
        raise PluginError(
            f"plugin {declared.plugin!r} declares {kind} {declared.spec.name!r} but its "
            f"{hook_name} returned None for it",
            plugin=declared.plugin,
            hook=hook_name,
        )
    return result


def unserved_reason(pm: pluggy.PluginManager, declared: Declared[Any]) -> str | None:
    """Why ``declared`` cannot be used although it is declared: its plugin does not
    implement the hook that serves it; ``None`` when it does."""
    if getattr(declared.spec, "origin", "plugin") == "torch":
        return None
    if getattr(declared.spec, "compile", None) is not None:  # a backend carrying its compile
        return None
    hook_name = SERVING_HOOK[type(declared.spec)]
    if implementation(pm, hook_name, declared.plugin) is not None:
        return None
    kind = DECLARATION_KINDS[DECLARING_HOOK[type(declared.spec)]]
    return (
        f"plugin {declared.plugin!r} declares {kind} {declared.spec.name!r} but does not "
        f"implement {hook_name}, so the name cannot be used"
    )
