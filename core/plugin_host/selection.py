"""Run a selector by name through the plugin manager that is planning now.

A selector that builds on another one (``hierarchical`` on ``repeated``) calls
:func:`select_with` instead of importing the other plugin: the request goes through the same
plugin manager as the user's, so a plugin disabled with ``TORCHKILN_DISABLED_PLUGINS`` stays
disabled and a plugin that overrides ``repeated`` is the one used.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import TYPE_CHECKING

from torch import nn

if TYPE_CHECKING:
    from torchkiln.configuration.config import CompileConfig
    from torchkiln.plugin_host.plugin_manager import PluginManager
    from torchkiln.plugin_host.region_plan import RegionPlan

_PLANNING_WITH: contextvars.ContextVar[PluginManager | None] = contextvars.ContextVar(
    "torchkiln_planning_with", default=None
)


@contextlib.contextmanager
def planning_with(pm: PluginManager) -> Iterator[None]:
    """Make ``pm`` the manager :func:`select_with` uses while a plan is being made."""
    token = _PLANNING_WITH.set(pm)
    try:
        yield
    finally:
        _PLANNING_WITH.reset(token)


def select_with(model: nn.Module, config: CompileConfig, selector: str) -> RegionPlan:
    """The plan selector ``selector`` makes for ``model``, through the active plugin manager.

    :raises PluginError: no plugin declares ``selector`` (the message says which plugins are
        disabled or failed to load).
    """
    from torchkiln.plugin_host.default_manager import get_plugin_manager

    pm = _PLANNING_WITH.get() or get_plugin_manager()
    plan: RegionPlan = pm.select_regions(model=model, config=config, selector=selector.lower())
    return plan
