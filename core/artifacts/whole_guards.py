"""The guards a whole-model compiled function keeps when it is saved, and what replaces the
ones it cannot keep.

torch saves a compiled function's guards with it, except guards on object identity, which have
no meaning in another process: ``ID_MATCH``, ``CLASS_MATCH``, ``MODULE_MATCH``,
``FUNCTION_MATCH``, ``CLOSURE_MATCH``, ``BUILTIN_MATCH`` and any guard derived from them
(``CONSTANT_MATCH`` on a code object). A whole model's trace has dozens: the model's classes, the
modules whose functions it calls (``transformers.masking_utils``), their closures, builtins.
They are dropped, and each kind is replaced by a check made when the function is loaded:

- classes, functions, closures and code of the model: the **code hash**, over the source files
  of every class in the model (:func:`torchkiln.artifacts.directory.code_hash`) and of every module a
  dropped guard reached, recorded when built and compared when loaded;
- modules: the same files, plus the versions of torch and of each package those modules belong
  to (in the manifest's environment and :attr:`WholeArtifacts.packages`);
- builtins (``len``, ``isinstance``): not replaced; a program that rebinds a builtin for a
  model's module is not supported (as with every saved ``torch.compile`` artifact);
- the module tree: the **tree hash** over every submodule's path and class, and the structure
  hash over parameters' and buffers' names, shapes and dtypes.

Guards on transformers' output-capturing registry (``_CAN_RECORD_REGISTRY``) are dropped too. A
model's forward looks its own class's recordable outputs up in that process-wide dict, keyed by
class name, and the trace guards on the *position* of every key: which depends on the model
classes the process happened to construct first, so the function would not load in another
process (nor in the same one after another model was built). The entry is what the class set
at construction from its own ``_can_record_outputs``, which the code hash covers.

One more guard is dropped on purpose: that a *region's* instance ``__dict__`` holds no
``forward``. torchkiln installs exactly that attribute on each region for the regional tier,
and its function is the class's own ``forward``, compiled; the whole-model form traced the
class's ``forward`` in the builder. The tiered runtime checks, on every whole-model call, that
each region's ``forward`` is still torchkiln's (:mod:`torchkiln.tiered.runtime`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
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


Filter = Callable[[list[Any]], list[bool]]
