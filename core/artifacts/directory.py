"""The precompiled-artifact directory: what it holds and the keys that decide whether it fits.

Layout of a directory written by :func:`torchkiln.precompile`::

    manifest.json                 environment key, one entry per region group and kind
    groups/<NNN>-<group>-<kind>-<N>.bin  torch's serialised compiled function (save_compiled_function)
    kernels/                      the inductor cache the compile filled (generated code and
                                  compiled C++ / Triton kernels), so loading compiles nothing

An artifact fits a model when its **environment** (torch version, backend, mode, options,
dynamic, device, dtype) matches the configuration and the model, and its **group** matches
by name, by the hash of the source files that define the group's classes, and by the group's
parameter and buffer layout. Input specs (shapes, dtypes, grad mode) are checked on every
call by the guards torch saved with the function.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs
import torch
from torch import nn

from torchkiln.configuration.config import CompileConfig
from torchkiln.errors import TorchkilnError

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
GROUPS_DIR = "groups"
KERNELS_DIR = "kernels"
KINDS = ("inference", "training")
"""``inference``: the group compiled under ``torch.no_grad()`` with the model in eval mode.
``training``: compiled with grad enabled and the model in train mode (forward and backward)."""


class ArtifactError(TorchkilnError):
    """Precompiled artifacts that cannot be written, read or used (and ``artifacts_strict``
    is set, or the request itself is wrong)."""


def _canonical(value: Any) -> Any:
    """A JSON-safe, process-independent form of an option value (callables by name)."""
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if callable(value):
        return f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', '?')}"
    return repr(value)


def model_device_dtype(model: nn.Module) -> tuple[str, str]:
    """Device type and floating dtype of the model's first floating parameter (or buffer)."""
    for tensor in [*model.parameters(), *model.buffers()]:
        if tensor.is_floating_point():
            return tensor.device.type, str(tensor.dtype).removeprefix("torch.")
    return "cpu", "float32"


def environment_key(config: CompileConfig, model: nn.Module) -> dict[str, Any]:
    """What the whole directory is keyed by (every group was compiled under it)."""
    device, dtype = model_device_dtype(model)
    return {
        "torch": torch.__version__,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "backend": config.backend,
        "mode": config.mode,
        "options": _canonical(dict(config.options)),
        "dynamic": config.dynamic,
        "device": device,
        "dtype": dtype,
    }


def environment_mismatches(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """``field: saved X, now Y`` for every key that differs."""
    return [
        f"{key}: precompiled with {saved.get(key)!r}, now {current.get(key)!r}"
        for key in current
        if saved.get(key) != current.get(key)
    ]


def _source_files(module: nn.Module) -> list[str]:
    files = set()
    for sub in module.modules():
        try:
            source = inspect.getsourcefile(type(sub))
        except (TypeError, OSError):
            source = None
        if source:
            files.add(source)
    return sorted(files)


def code_hash(module: nn.Module) -> str:
    """SHA-256 over the source files defining the classes of ``module`` and its children.

    Whole files, not just the classes: a block's forward calls helper functions of its file
    (``apply_rotary_pos_emb``), and the compiled code has them inlined.
    """
    digest = hashlib.sha256()
    for path in _source_files(module):
        digest.update(os.path.basename(path).encode())
        try:
            digest.update(Path(path).read_bytes())
        except OSError:
            digest.update(b"<unreadable>")
    for sub in module.modules():  # classes without a readable file still count by name
        digest.update(f"{type(sub).__module__}.{type(sub).__qualname__}".encode())
    return digest.hexdigest()


def structure_hash(module: nn.Module) -> str:
    """SHA-256 over the names, shapes and dtypes of the module's parameters and buffers."""
    digest = hashlib.sha256()
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
    return digest.hexdigest()


def describe_value(value: Any) -> str:
    """One input's spec as the manifest shows it: ``Tensor[1, 128, 256] float32 grad``."""
    if isinstance(value, torch.Tensor):
        grad = " grad" if value.requires_grad else ""
        return f"Tensor{list(value.shape)} {str(value.dtype).removeprefix('torch.')}{grad}"
    if isinstance(value, list | tuple):
        inner = ", ".join(describe_value(v) for v in value)
        return f"{type(value).__name__}({inner})"
    if value is None or isinstance(value, bool | int | float | str):
        return repr(value)
    return type(value).__name__


def input_spec(args: Iterable[Any], kwargs: Mapping[str, Any]) -> list[str]:
    return [describe_value(a) for a in args] + [
        f"{k}={describe_value(v)}" for k, v in kwargs.items()
    ]


@attrs.define
class GroupEntry:
    """One compiled function of one group, for one kind."""

    kind: str
    file: str
    """Relative to the artifact directory."""
    inputs: list[str]
    compile_seconds: float

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.define
class GroupArtifacts:
    name: str
    cls: str
    code_hash: str
    structure_hash: str
    regions: int
    entries: list[GroupEntry] = attrs.Factory(list)

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.define
class Manifest:
    environment: dict[str, Any]
    groups: list[GroupArtifacts] = attrs.Factory(list)
    skipped: list[dict[str, str]] = attrs.Factory(list)
    """``{"group", "kind", "reason"}`` for every entry that could not be precompiled."""
    format: int = FORMAT_VERSION
    cpu_isa: dict[str, Any] | None = None
    """Inductor on CPU: the ISA probe's answers, the CPU's capabilities and the compiler
    (:mod:`torchkiln.artifacts.isa_probe`); loading answers the probe from them when they match."""
    whole: dict[str, Any] | None = None
    """The whole-model entry (:class:`torchkiln.artifacts.whole_model.WholeArtifacts` as a dict),
    written by ``precompile(..., whole=True)`` or the tiered builder."""

    def group(self, name: str) -> GroupArtifacts | None:
        return next((g for g in self.groups if g.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Manifest:
        groups = [
            GroupArtifacts(
                name=g["name"],
                cls=g["cls"],
                code_hash=g["code_hash"],
                structure_hash=g["structure_hash"],
                regions=int(g["regions"]),
                entries=[GroupEntry(**e) for e in g["entries"]],
            )
            for g in data["groups"]
        ]
        return cls(
            environment=dict(data["environment"]),
            groups=groups,
            skipped=list(data.get("skipped", [])),
            format=int(data["format"]),
            cpu_isa=data.get("cpu_isa"),
            whole=data.get("whole"),
        )


def entry_file(index: int, group: str, kind: str, variant: int = 0) -> str:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", group)[:60]
    return f"{GROUPS_DIR}/{index:03d}-{slug}-{kind}-{variant}.bin"


def write_manifest(directory: Path, manifest: Manifest) -> None:
    text = json.dumps(manifest.to_dict(), indent=1)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".manifest.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, directory / MANIFEST)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_manifest(directory: str | os.PathLike[str]) -> Manifest:
    """:raises ArtifactError: missing directory or manifest, unreadable or another format."""
    path = Path(directory).expanduser() / MANIFEST
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise ArtifactError(
            f"artifacts directory {str(directory)!r} has no {MANIFEST} (write one with "
            "torchkiln.precompile or `torchkiln precompile`)"
        ) from error
    except (OSError, ValueError) as error:
        raise ArtifactError(f"{path} cannot be read: {error}") from error
    if not isinstance(data, dict) or data.get("format") != FORMAT_VERSION:
        found = data.get("format") if isinstance(data, dict) else None
        raise ArtifactError(
            f"{path} has format {found!r}; this torchkiln reads format {FORMAT_VERSION}"
        )
    try:
        return Manifest.from_dict(data)
    except (KeyError, TypeError, ValueError) as error:
        raise ArtifactError(f"{path} is malformed: {type(error).__name__}: {error}") from error
