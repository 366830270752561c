"""Saved compiled code on disk: the keys that decide whether it fits, an entry's ``meta.json``,
and the one checked way to read its files.

Every entry of a store (a region group's call, :mod:`torchkiln.jobs.entry`, or a whole-model
form, :mod:`torchkiln.artifacts.whole_build`) lists its files in ``meta.json`` with their size
and SHA-256. An entry is code (pickles, shared libraries): :func:`read_entry` is the one way
torchkiln reads its files, and it refuses any file the recorded size and SHA-256 do not vouch
for. docs/precompile.md says what is checked and why."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import inspect
import json
import os
import re
import shutil
import stat
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

import attrs
import torch
from torch import nn

from torchkiln.artifacts.isa_probe import machine_local
from torchkiln.configuration.config import CompileConfig
from torchkiln.errors import TorchkilnError
from torchkiln.files import write_atomic

META = "meta.json"
"""An entry's metadata: its key's fields, and every file's size and SHA-256."""
META_FORMAT = 1
MAX_META_BYTES = 4 * 2**20
"""A larger meta.json is refused unread (a real one is a few kilobytes)."""
MANIFEST = "manifest.json"
"""What a directory an older torchkiln precompiled into holds (refused, with a message)."""
KERNELS_DIR = "kernels"
WHOLE_DIR = "whole"
"""The whole-model entry's compiled functions (:mod:`torchkiln.artifacts.whole_build`)."""
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


def installed_version(distribution: str) -> str | None:
    """The installed release of ``distribution``, or ``None`` when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def class_name(module: nn.Module) -> str:
    return f"{type(module).__module__}.{type(module).__qualname__}"


def hash_files(digest: Any, paths: Iterable[str]) -> Any:
    """``digest`` updated with each file's name and bytes, in path order."""
    for path in sorted(set(paths)):
        digest.update(os.path.basename(path).encode())
        try:
            digest.update(Path(path).read_bytes())
        except OSError:
            digest.update(b"<unreadable>")
    return digest


def _source_files(module: nn.Module) -> list[str]:
    """The files defining the classes of ``module``, its submodules and the objects they hold
    as attributes (an attention processor): a saved function keeps no identity guard on what
    those classes hold (:mod:`torchkiln.engine.saved_guards`), so their source is keyed."""
    files = set()
    for cls in {type(sub) for sub in module.modules()} | _attribute_classes(module):
        try:
            source = inspect.getsourcefile(cls)
        except (TypeError, OSError):
            source = None
        if source:
            files.add(source)
    return sorted(files)


_NOT_HELD_OBJECTS = (
    nn.Module,
    torch.Tensor,
    types.FunctionType,
    types.MethodType,
    functools.partial,
)


def _attribute_classes(module: nn.Module) -> set[type]:
    """Classes of the objects the modules hold as public attributes (an attention processor, a
    config), other than modules, tensors, functions and Python's own types (numbers, strings,
    containers). An instance ``forward`` is left out: it is whoever wraps the module (torchkiln's
    runtime, accelerate's hook), which differs between a compiled model and its plain copy;
    the class's own forward is in the class's file."""
    return {
        type(value)
        for sub in module.modules()
        for name, value in vars(sub).items()
        if not name.startswith("_")
        and name != "forward"
        and not isinstance(value, _NOT_HELD_OBJECTS)
        and type(value).__module__ != "builtins"
    }


def code_hash(module: nn.Module) -> str:
    """SHA-256 over the source files defining the classes of ``module`` and its children.

    Whole files, not just the classes: a block's forward calls helper functions of its file
    (``apply_rotary_pos_emb``), and the compiled code has them inlined.
    """
    digest = hash_files(hashlib.sha256(), _source_files(module))
    for sub in module.modules():  # classes without a readable file still count by name
        digest.update(class_name(sub).encode())
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


class StoredFile(Protocol):
    """What :func:`read_entry` needs of a record (a :class:`KernelFile`, a whole-model entry)."""

    file: str
    """The path relative to the directory, with ``/`` separators."""
    size: int
    sha256: str


@attrs.define
class KernelFile:
    """One file of ``kernels/`` (inductor's cache): generated code, compiled libraries."""

    file: str
    """Relative to the artifact directory (``kernels/...``)."""
    size: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def write_meta(directory: Path, meta: Mapping[str, Any]) -> None:
    write_atomic(directory / META, json.dumps(meta, indent=1, default=repr))


def read_meta(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """An entry's ``meta.json`` (a region entry's or a whole-model form's), refusing a link, a
    non-regular file or one over :data:`MAX_META_BYTES` before reading it.

    :raises ArtifactError: missing, unreadable, malformed (nested too deeply), or another
        format.
    """
    path = Path(directory) / META
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise ArtifactError(f"{path} is not a regular file")
            if info.st_size > MAX_META_BYTES:
                raise ArtifactError(
                    f"{path} has {info.st_size} bytes; a manifest has at most {MAX_META_BYTES}"
                )
            meta = json.loads(handle.read(MAX_META_BYTES + 1).decode("utf-8"))
    except (OSError, ValueError) as error:
        raise ArtifactError(f"{path} cannot be read: {error}") from error
    except RecursionError as error:
        raise ArtifactError(f"{path} is malformed: nested too deeply") from error
    if not isinstance(meta, dict) or meta.get("format") != META_FORMAT:
        raise ArtifactError(f"{path} is not a torchkiln entry of format {META_FORMAT}")
    return meta


def kernel_records(meta: Mapping[str, Any]) -> list[KernelFile]:
    """The kernel files an entry's metadata lists.

    :raises ArtifactError: a malformed list.
    """
    try:
        return [KernelFile(**k) for k in meta["kernels"]]
    except (KeyError, TypeError) as error:
        raise ArtifactError(f"entry metadata is malformed: {error}") from error


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_SHA256 = re.compile(r"[0-9a-f]{64}")


def entry_path(directory: str | os.PathLike[str], relative: str) -> Path:
    """``directory/relative`` when ``relative`` stays inside ``directory``: relative, no
    ``..``, no backslash, and no link on the way (the resolved path is the path itself).

    :raises ArtifactError: naming the entry.
    """
    root = Path(directory).expanduser().resolve()
    parts = PurePosixPath(relative).parts if isinstance(relative, str) else ()
    if (
        not parts
        or PurePosixPath(relative).is_absolute()
        or ".." in parts
        or "\\" in relative
        or "\0" in relative
    ):
        raise ArtifactError(
            f"manifest entry {relative!r} points outside the artifact directory {str(root)!r}"
        )
    path = root.joinpath(*parts)
    if path.resolve() != path:
        raise ArtifactError(
            f"manifest entry {relative!r} is or passes through a link (resolves to "
            f"{str(path.resolve())!r}); artifact directories hold plain files only"
        )
    return path


def under(file: str, top: str) -> PurePosixPath:
    """``file`` (a manifest record's path) when it lies inside the directory's ``top`` folder.

    :raises ArtifactError: naming the entry.
    """
    relative = PurePosixPath(file)
    if relative.parts[:1] != (top,) or len(relative.parts) < 2:
        raise ArtifactError(f"manifest entry {file!r} is not under {top}/")
    return relative


def stored_file(directory: str | os.PathLike[str], relative: str) -> KernelFile:
    """The manifest record (file, size, sha256) of a file the writer put at
    ``directory/relative``."""
    digest, size = hashlib.sha256(), 0
    with open(Path(directory) / relative, "rb") as handle:
        while chunk := handle.read(2**20):
            digest.update(chunk)
            size += len(chunk)
    return KernelFile(relative, size, digest.hexdigest())


def kernel_files(directory: str | os.PathLike[str]) -> list[KernelFile]:
    """The manifest records of every regular file of ``directory/kernels`` (its ``locks/``,
    inductor's lock files, and the ISA probe's load markers, this machine's answers
    (:func:`torchkiln.artifacts.isa_probe.machine_local`), removed first), as the writer lists
    them."""
    root = Path(directory)
    shutil.rmtree(root / KERNELS_DIR / "locks", ignore_errors=True)
    found = []
    for parent, _, files in os.walk(root / KERNELS_DIR):
        for name in sorted(files):
            path = Path(parent) / name
            if machine_local(name):
                path.unlink(missing_ok=True)
            elif path.is_file() and not path.is_symlink():
                found.append(stored_file(root, path.relative_to(root).as_posix()))
    return found


def read_entry(directory: str | os.PathLike[str], entry: StoredFile) -> bytes:
    """The bytes of ``entry`` (any manifest record with ``file``, ``size`` and ``sha256``),
    returned only after checking them against the manifest. The one way torchkiln reads a
    file of an artifact directory: nothing is unpickled or imported before this check.

    Checks, in order: the path is confined to ``directory`` (:func:`entry_path`); the file is
    opened without following a link and is a regular file (not ``/dev/zero``, not a FIFO);
    its size is the recorded size (a larger file is never read); its SHA-256 is the recorded
    one.

    :raises ArtifactError: naming the entry; a size or hash mismatch says the file "does not
        match" the manifest ("tampered with or corrupted").
    """
    name = getattr(entry, "file", None)
    size, sha256 = getattr(entry, "size", None), getattr(entry, "sha256", None)
    if not isinstance(name, str):
        raise ArtifactError(f"manifest entry {name!r} is malformed: its file must be a string")
    if (
        not isinstance(size, int)
        or size < 0
        or not isinstance(sha256, str)
        or not _SHA256.fullmatch(sha256)
    ):
        raise ArtifactError(
            f"manifest entry {name!r} has no valid size and sha256 (re-run `torchkiln precompile`)"
        )
    path = entry_path(directory, name)
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK)
    except OSError as error:
        raise ArtifactError(f"manifest entry {name!r} cannot be opened: {error}") from error
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ArtifactError(f"manifest entry {name!r} is not a regular file")
        if info.st_size != size:
            raise ArtifactError(_tampered(name, f"{info.st_size} bytes, the manifest says {size}"))
        data = handle.read(size + 1)
    if len(data) != size:
        raise ArtifactError(_tampered(name, f"read {len(data)} bytes, the manifest says {size}"))
    if hashlib.sha256(data).hexdigest() != sha256:
        raise ArtifactError(_tampered(name, "its SHA-256 differs from the manifest's"))
    return data


def _tampered(name: str, detail: str) -> str:
    return (
        f"manifest entry {name!r} does not match the manifest ({detail}): the file was "
        "tampered with or corrupted; nothing of it was loaded"
    )


def error_reason(error: BaseException) -> str:
    """``Type: first line`` of an error, as a manifest's ``skipped`` and the reports give it."""
    first = next((line for line in str(error).splitlines() if line.strip()), "")
    return f"{type(error).__name__}: {first}"[:500]


def closure_data(fn: Callable[..., Any]) -> dict[str, Any]:
    """The group function's closure values, handed to torch's pickler as external data.

    Saving them by reference fails for decorated functions (a transformers layer's
    ``forward``: "it's not the same object as ...forward"); as external data they are never
    pickled, and the loader supplies the live objects by the same keys.
    """
    names = fn.__code__.co_freevars
    cells = fn.__closure__ or ()
    return {f"closure:{name}": cell.cell_contents for name, cell in zip(names, cells, strict=True)}
