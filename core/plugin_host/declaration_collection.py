"""Collecting what the plugins declare (backends, selectors, distributed strategies, layer
caches) from their ``declare_*`` hooks: the plugin called first wins a name declared twice, and
a hook that raises or returns something else than a list of its spec type is reported with
its plugin's name, so that the plugin manager quarantines that plugin and asks the others again.

The functions take pluggy's manager, not torchkiln's, so this module does not import
:mod:`torchkiln.plugin_host.plugin_manager` (which imports it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pluggy
from pluggy import HookImpl

from torchkiln.plugin_host.plugin_info import (
    DeclarationFailed,
    Declared,
    FailedPlugin,
    PluginInfo,
    check_specs,
)

CallImpl = Callable[[str, HookImpl], Any]
"""Calls one implementation of a hook that takes no argument (``PluginManager.call_impl``, so
that ``TORCHKILN_TRACE_PLUGINS=1`` shows the call)."""


def collect_declarations(
    pm: pluggy.PluginManager, hook_name: str, kind: str, call_impl: CallImpl
) -> tuple[dict[str, Declared[Any]], list[str]]:
    """Every plugin's declarations, the first called winning a name; and the warnings
    about names declared twice.

    :raises DeclarationFailed: naming the plugin whose hook failed.
    """
    result: dict[str, Declared[Any]] = {}
    twice: list[str] = []
    hook = getattr(pm.hook, hook_name)
    # pluggy calls the last registered (or tryfirst) implementation first: that one wins.
    for impl in reversed(hook.get_hookimpls()):
        for spec in _declarations(hook_name, impl, call_impl):
            if spec.name in result:
                winner = result[spec.name].plugin
                twice.append(_declared_twice(kind, spec.name, winner, impl.plugin_name))
            else:
                result[spec.name] = Declared(spec, impl.plugin_name)
    return result, twice


def _declarations(hook_name: str, impl: HookImpl, call_impl: CallImpl) -> Sequence[Any]:
    """What ``impl`` declares, checked to be a list (or tuple) of the hook's spec type."""
    try:
        specs: Sequence[Any] = call_impl(hook_name, impl) or ()
    except Exception as error:
        detail = f"raised {type(error).__name__}: {error}"
        raise DeclarationFailed(impl.plugin_name, hook_name, detail) from error
    check_specs(hook_name, impl.plugin_name, specs)
    return specs


def _declared_twice(kind: str, name: str, winner: str, other: str) -> str:
    return (
        f"{kind} {name!r} is declared by both plugin {winner!r} and plugin {other!r}; using "
        f"{winner!r} (the first in precedence order: registered last, or tryfirst; "
        "docs/plugins/packaging.md)"
    )


def quarantine_record(
    plugin: str, hook_name: str, error: DeclarationFailed, info: PluginInfo | None
) -> FailedPlugin:
    """What :attr:`PluginManager.failed` records about ``plugin``, quarantined because its
    ``hook_name`` failed; ``info``: what was known about it when it was installed (an entry
    point), else ``None``."""
    return FailedPlugin(
        plugin,
        info.target if info else None,
        info.distribution if info else None,
        info.version if info else None,
        error.detail,
        hook=hook_name,
    )
