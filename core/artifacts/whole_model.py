"""The whole-model entry of an artifact directory: what it records and how it is checked.

It sits in ``manifest.json`` under ``whole`` beside the region groups, its compiled functions
under ``whole/``, and shares the directory's ``kernels/`` and environment key::

    whole/<kind>-<N>.bin   torch's serialised whole-model function (save_compiled_function)

It fits a model when the environment fits (as for region groups) and the model's class, code
hash, tree hash and structure hash equal the recorded ones (:mod:`torchkiln.artifacts.whole_guards`
says what these replace); each entry's saved guards then decide, per call, whether it serves.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs
from torch import nn

from torchkiln.artifacts.directory import code_hash, structure_hash

WHOLE_DIR = "whole"


@attrs.define
class WholeEntry:
    """One compiled function of the whole model, for one family of calls."""

    kind: str
    """``inference`` or ``training`` (grad mode)."""
    training: bool
    """The model's train/eval mode when it was compiled."""
    file: str
    inputs: list[str]
    dynamic: dict[str, list[int]]
    """Tensor path -> dimensions compiled as dynamic."""
    module_refs: dict[str, str]
    compile_seconds: float
    sha256: str = ""
    size: int = 0


@attrs.define
class WholeArtifacts:
    cls: str
    code_hash: str
    tree_hash: str
    structure_hash: str
    region_paths: list[str]
    modules: list[str]
    """Python modules whose identity guards were dropped; their files join the code hash."""
    packages: dict[str, str]
    dropped_guards: dict[str, int]
    entries: list[WholeEntry] = attrs.Factory(list)

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WholeArtifacts:
        fields = {f.name for f in attrs.fields(cls)} - {"entries"}
        values = {name: data[name] for name in fields}
        return cls(**values, entries=[WholeEntry(**e) for e in data["entries"]])


def class_name(model: nn.Module) -> str:
    return f"{type(model).__module__}.{type(model).__qualname__}"


def tree_hash(model: nn.Module) -> str:
    """SHA-256 over every submodule's path and class."""
    digest = hashlib.sha256()
    for path, module in model.named_modules():
        digest.update(f"{path}:{type(module).__module__}.{type(module).__qualname__};".encode())
    return digest.hexdigest()


def whole_code_hash(model: nn.Module, files: Iterable[str]) -> str:
    """The model's code hash extended by the source files of the modules the trace reached."""
    digest = hashlib.sha256(code_hash(model).encode())
    for path in sorted(set(files)):
        digest.update(Path(path).name.encode())
        try:
            digest.update(Path(path).read_bytes())
        except OSError:
            digest.update(b"<unreadable>")
    return digest.hexdigest()


def package_versions(modules: Iterable[str]) -> dict[str, str]:
    """The installed version of each top-level package among ``modules`` that has one."""
    versions = {}
    for top in sorted({m.split(".", 1)[0] for m in modules}):
        try:
            versions[top] = importlib.metadata.version(top)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


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
