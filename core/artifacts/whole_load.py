"""Loading a directory's whole-model entry: saved code like a group's entries (:class:`SavedCode`).

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
from torchkiln.engine.saved_code import SavedCode


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


def load_whole(directory: Path, meta: dict[str, Any], model: nn.Module) -> SavedCode:
    """The whole-model form in ``directory``: its functions, tried by their saved guards as a
    group's entries are (:class:`~torchkiln.engine.saved_code.SavedCode`; frame locals
    ``module``, ``args``, ``kwargs``).

    :raises ArtifactError: no whole-model entry, one that does not fit ``model``, or a
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
            loaded.append((entry.kind, fn))
    seconds = time.perf_counter() - started
    return SavedCode(str(directory), loaded, load_seconds=seconds)
