"""pluggy's private hook execution, the one name of pluggy's that torchkiln calls
(``PluginManager._hookexec``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def execute_hook(
    pm: Any, hook_name: str, impls: Sequence[Any], kwargs: dict[str, Any], firstresult: bool
) -> Any:
    """Run ``impls`` (plain implementations first, then wrappers; the last is called first) for
    one call of ``hook_name``, as pluggy's hook caller does for all of a hook's implementations.

    Calls ``PluginManager._hookexec(hook_name, impls, kwargs, firstresult)``, the one entry every
    pluggy hook call goes through: pluggy has no public way to call a chosen list of
    implementations inside the hook's wrappers (``subset_hook_caller`` filters by plugin, which
    would drop a wrapper of the plugin that implements the hook). Verified: torch 2.11, 2.13,
    2.14, 2.15 (pluggy 1.5 to 1.7; tests/plugin_host/test_hook_wrappers.py checks its
    signature).
    """
    return pm._hookexec(hook_name, list(impls), kwargs, firstresult)
