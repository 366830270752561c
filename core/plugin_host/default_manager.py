"""The process-wide plugin manager (created on first use) and what every ``plugins=`` argument
accepts."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Union

import pluggy

from torchkiln.errors import PluginError
from torchkiln.plugin_host.plugin_manager import PluginManager

_default_manager: PluginManager | None = None


def get_plugin_manager() -> PluginManager:
    """The process-wide default plugin manager (created on first use)."""
    global _default_manager
    if _default_manager is None:
        _default_manager = PluginManager()
    return _default_manager


PluginsArg = Union["PluginManager", Iterable[object], None]
"""What a ``plugins=`` argument accepts (see :func:`as_plugin_manager`)."""


def as_plugin_manager(plugins: PluginsArg) -> PluginManager:
    """What every ``plugins=`` argument accepts: ``None`` (the process-wide manager), a
    :class:`PluginManager`, or plugin objects/modules (a fresh manager with the built-ins and
    them; no entry points, no environment controls)."""
    if plugins is None:
        return get_plugin_manager()
    if isinstance(plugins, PluginManager):
        return plugins
    if isinstance(plugins, pluggy.PluginManager):
        raise PluginError(
            "plugins= takes a torchkiln.PluginManager (or a list of plugins), not a plain "
            "pluggy.PluginManager"
        )
    if isinstance(plugins, str | bytes) or not isinstance(plugins, Iterable):
        raise PluginError(
            f"plugins= takes a torchkiln.PluginManager or a list of plugin objects, got "
            f"{type(plugins).__name__}"
        )
    manager = PluginManager(entry_points=False, env={})
    for plugin in plugins:
        manager.register(plugin)
    return manager


def reset_plugin_manager() -> None:
    """Forget the default manager (tests; after installing a plugin in-process)."""
    global _default_manager
    _default_manager = None
