"""Plugin API v1 import paths, kept working with a ``DeprecationWarning`` naming the new one.

Version 1 plugins imported from ``torchkiln.specs``, ``torchkiln.hookspecs``,
``torchkiln.regions`` and ``torchkiln.distributed``; everything a plugin needs now comes from
:mod:`torchkiln.plugin`. :data:`V1_NAMES` is the one table of what moved where; each old module
sets ``__getattr__ = v1_names(__name__)``, which resolves each old name lazily (PEP 562), warns
once per import site, and hands back the very same object.

New module paths are strings here, imported on use: this module imports nothing of torchkiln,
so any layer may use it.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

_PLUGIN = "torchkiln.plugin"
_HOOKS = "torchkiln.plugin_host.hooks"

V1_NAMES: Mapping[str, Mapping[str, str]] = {
    "torchkiln.specs": dict.fromkeys(
        ("Availability", "BackendSpec", "DistributedSpec", "SelectorSpec"), _PLUGIN
    ),
    "torchkiln.regions": dict.fromkeys(
        ("EagerPart", "Region", "RegionGroup", "RegionPlan"), _PLUGIN
    ),
    "torchkiln.hookspecs": dict.fromkeys(("PROJECT_NAME", "hookimpl", "hookspec"), _PLUGIN),
    "torchkiln.distributed": {"DistributedResult": _PLUGIN},
}
"""Old module -> old name -> the module to import it from now. ``torchkiln.hookspecs`` also
gives every hook specification (:data:`torchkiln.plugin.HOOK_NAMES`) from :data:`_HOOKS`."""


def v1_names(old_module: str) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``old_module``, a key of :data:`V1_NAMES`."""

    def __getattr__(name: str) -> Any:
        new_module = V1_NAMES[old_module].get(name)
        if new_module is None and old_module == "torchkiln.hookspecs":
            new_module = _HOOKS if name in importlib.import_module(_PLUGIN).HOOK_NAMES else None
        if new_module is None:
            raise AttributeError(f"module {old_module!r} has no attribute {name!r}")
        warnings.warn(
            f"{old_module}.{name} is deprecated: use `from {new_module} import {name}` "
            "(torchkiln plugin API v2)",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(new_module), name)

    return __getattr__
