"""The guards a whole-model compiled function keeps when it is saved, and what replaces the
ones it cannot keep.

torch cannot save guards on object identity (``ID_MATCH``, ``CLASS_MATCH``, ``MODULE_MATCH``,
... and guards derived from them): they mean nothing in another process, and a whole model's
trace has dozens. They are dropped and replaced by checks made at load: the code hash over the
source files of the model's classes and of every module a dropped guard reached, the package
versions, and the tree and structure hashes. Also dropped: guards on the key positions of
transformers' ``_CAN_RECORD_REGISTRY`` (they depend on which model classes the process built
first), and the guard that a region has no instance ``forward`` (torchkiln installs one, and
:mod:`torchkiln.tiered.runtime` checks it on every call). docs/tiered.md has the full table.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torchkiln._internals.cache_entries import (
    guard_checked_attribute,
    guard_imported_modules,
    guard_kinds,
    guard_submodule_path,
)
from torchkiln._internals.transformers import guards_can_record_registry

IDENTITY_GUARDS = frozenset(
    {
        "ID_MATCH",
        "CLASS_MATCH",
        "MODULE_MATCH",
        "FUNCTION_MATCH",
        "CLOSURE_MATCH",
        "BUILTIN_MATCH",
    }
)


def module_path(guard_name: str) -> str | None:
    """``module._modules['model']._modules['layers']._modules['0']`` -> ``model.layers.0``;
    ``None`` when the name is not a plain chain of submodules of the traced module."""
    return guard_submodule_path(guard_name, "module")


class GuardFilter:
    """``guard_filter_fn`` for a whole-model trace: drops what cannot be saved (above) and
    records what it dropped, so the replacements can be computed."""

    def __init__(self, region_paths: Iterable[str]):
        self.region_paths = frozenset(region_paths)
        self.dropped: dict[str, int] = {}
        self.modules: set[str] = set()
        """Python modules whose identity guards were dropped (their files join the code hash)."""

    def __call__(self, entries: list[Any]) -> list[bool]:
        return [self._keep(entry) for entry in entries]

    def _keep(self, entry: Any) -> bool:
        if guard_kinds(entry) & IDENTITY_GUARDS:
            self._drop(entry.guard_type)
            self.modules.update(guard_imported_modules(entry.name))
            return False
        if guards_can_record_registry(entry.name):
            self._drop("transformers output registry")
            return False
        if entry.guard_type == "NOT_PRESENT_IN_GENERIC_DICT" and self._region_forward(entry):
            self._drop("region forward")
            return False
        return True

    def _region_forward(self, entry: Any) -> bool:
        return (
            guard_checked_attribute(entry) == "forward"
            and module_path(entry.name) in self.region_paths
        )

    def _drop(self, kind: str) -> None:
        self.dropped[kind] = self.dropped.get(kind, 0) + 1


def referenced_files(modules: Iterable[str]) -> list[str]:
    """Source files of ``modules``, found without importing them where they are not imported
    yet; a module without a file (built-in) is skipped."""
    import importlib.util
    import sys

    files = []
    for name in sorted(set(modules)):
        path = getattr(sys.modules.get(name), "__file__", None)
        if path is None:
            try:
                spec = importlib.util.find_spec(name)
            except (ImportError, ValueError):
                spec = None
            path = spec.origin if spec is not None else None
        if path and path not in ("built-in", "frozen"):
            files.append(path)
    return files
