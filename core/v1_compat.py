"""Plugin API v1 import paths, kept working with a ``DeprecationWarning`` naming the new one.

Version 1 plugins imported from ``torchkiln.specs``, ``torchkiln.hookspecs``,
``torchkiln.regions`` and ``torchkiln.distributed``; everything a plugin needs now comes from
:mod:`torchkiln.plugin`. The old modules resolve each old name lazily (PEP 562), warn once per
import site, and hand back the very same object.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def moved_names(old_module: str, moved: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``old_module`` whose ``moved`` names now live elsewhere.

    :param moved: old attribute name -> the module to import it from now.
    """

    def __getattr__(name: str) -> Any:
        new_module = moved.get(name)
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


def deprecated_module(old_module: str, names: tuple[str, ...]) -> Callable[[str], Any]:
    """``moved_names`` for a module whose every public name moved to :mod:`torchkiln.plugin`."""
    return moved_names(old_module, dict.fromkeys(names, "torchkiln.plugin"))
