"""Loading a directory's whole-model entry into a :class:`WholeModelForm`.

Every entry's file is checked before torch unpickles it: confined to ``whole/`` in the
directory, a regular file of the recorded size, with the recorded SHA-256. The kernels are
merged into the inductor cache and the CPU probe is answered from the ``meta.json``, as for
region entries (:mod:`torchkiln.artifacts.precompiled`).
"""

from __future__ import annotations

import io
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchkiln._internals.aot_artifacts import loaded_guard_table
from torchkiln.artifacts.directory import (
    WHOLE_DIR,
    ArtifactError,
    class_name,
    kernel_records,
    read_entry,
    structure_hash,
    under,
)
from torchkiln.artifacts.precompiled import copy_kernels, loading
from torchkiln.artifacts.whole_build import (
    WholeArtifacts,
    WholeEntry,
    package_versions,
    tree_hash,
    whole_code_hash,
    whole_model_forward,
)
from torchkiln.artifacts.whole_guards import referenced_files


class WholeModelForm:
    """The whole model's loaded functions: ``match(args, kwargs)`` gives the first whose saved
    guards pass for this call, or ``None``
    (:class:`~torchkiln._internals.cache_entries.GuardTable`)."""

    def __init__(self, entries: list[tuple[WholeEntry, Any]], seconds: float):
        self.entries = [entry for entry, _ in entries]
        self._table = loaded_guard_table(fn for _, fn in entries)
        self.load_seconds = seconds

    def match(self, model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self._table.find({"module": model, "args": args, "kwargs": kwargs})

    def covered_calls(self) -> list[str]:
        """Per entry, the call family its saved guards admit (``args[0] int64[1, 12]``)."""
        return self._table.covered_calls()

    def why_not(self, model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The first failing guard of each entry, for the report."""
        failures = self._table.first_failures({"module": model, "args": args, "kwargs": kwargs})
        return "; ".join(
            f"{entry.kind}: {(failed or 'guards pass')[:200]}"
            for entry, failed in zip(self.entries, failures, strict=True)
        )


def _module_globals(entry: WholeEntry) -> dict[str, Any]:
    """The modules Dynamo's code loads by alias. Only modules this process has imported are
    supplied: a manifest never makes torchkiln import anything."""
    found = {}
    for alias, name in entry.module_refs.items():
        if name not in sys.modules:
            raise ArtifactError(
                f"whole-model entry {entry.file!r} needs module {name!r}, not imported here"
            )
        found[alias] = sys.modules[name]
    return found


def whole_mismatch(saved: WholeArtifacts, model: nn.Module, files: Iterable[str]) -> str | None:
    """Why ``saved`` does not fit ``model``; ``None`` when it does."""
    if saved.cls != class_name(model):
        return f"the model's class is {class_name(model)}, precompiled for {saved.cls}"
    if saved.tree_hash != tree_hash(model):
        return "the model's submodules differ in paths or classes (tree hash differs)"
    if saved.structure_hash != structure_hash(model):
        return "the model's parameters or buffers differ in names, shapes or dtypes"
    now = package_versions(saved.packages)
    if now != saved.packages:
        return f"package versions differ: built with {saved.packages}, now {now}"
    if saved.code_hash != whole_code_hash(model, files):
        return "the source of the model's classes or of a module it calls changed (code hash)"
    return None


def load_whole(directory: Path, meta: dict[str, Any], model: nn.Module) -> WholeModelForm:
    """:raises ArtifactError: no whole-model entry, one that does not fit ``model``, or a
    file that fails its checks."""
    if not meta.get("whole"):
        raise ArtifactError("the directory has no whole-model entry")
    saved = WholeArtifacts.from_dict(meta["whole"])
    if not saved.entries:
        raise ArtifactError("the whole-model entry has no compiled function")
    reason = whole_mismatch(saved, model, referenced_files(saved.modules))
    if reason is not None:
        raise ArtifactError(f"whole-model entry does not fit: {reason}")
    started = time.perf_counter()
    # Each kernel is checked against the meta.json before it is copied (read_entry).
    copy_kernels(directory, kernel_records(meta))
    loaded = []
    with loading(meta.get("cpu_isa"), meta["environment"].get("backend")):
        for entry in saved.entries:
            under(entry.file, WHOLE_DIR)
            data = read_entry(directory, entry)  # confined, no link, regular, size and hash
            f_globals = {**whole_model_forward.__globals__, **_module_globals(entry)}
            fn = torch.compiler.load_compiled_function(io.BytesIO(data), f_globals=f_globals)
            loaded.append((entry, fn))
    return WholeModelForm(loaded, time.perf_counter() - started)
