"""One shared entry: a region group's compiled function for one key, as files in a directory
(``meta.json``, ``entry.bin``, ``kernels/...``), as bytes on the wire, and loaded.

Built with torch's ``aot_compile`` and ``save_compiled_function`` into a fresh inductor cache
directory, so that every kernel the compile wrote travels with it; ``torchkiln.precompile``
writes the same entries (:mod:`torchkiln.jobs.precompile`). Every file is checked against
``meta.json`` (:func:`~torchkiln.artifacts.directory.read_entry`) before anything is copied,
unpickled or imported.
"""

from __future__ import annotations

import contextlib
import pickle
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from torch import nn

from torchkiln._internals.compiled_names import stable_compiled_fn_name
from torchkiln.artifacts.cache import apply_cache_dir
from torchkiln.artifacts.directory import (
    KERNELS_DIR,
    META_FORMAT,
    ArtifactError,
    KernelFile,
    closure_data,
    entry_path,
    kernel_files,
    kernel_records,
    read_entry,
    read_meta,
    stored_file,
    write_meta,
)
from torchkiln.artifacts.isa_probe import recorded_probes
from torchkiln.artifacts.precompiled import copy_kernels, load_functions
from torchkiln.engine.compile_state import REGION_ATTR
from torchkiln.engine.group_runtime import trace_settings_of

ENTRY = "entry.bin"
INSTALLED = ("forward", REGION_ATTR)


@contextlib.contextmanager
def plain_module(module: nn.Module) -> Iterator[None]:
    """The module as the user built it while torch saves the guards: torch pickles the guarded
    module's ``__dict__``, which must not hold torchkiln's installed forward and region state
    (neither pickles, and neither exists in the loading process before compile), nor gradients:
    torch saves a parameter's ``.grad`` as a placeholder that its loader then refuses to assign
    (``TypeError: assigned grad expected to be a Tensor or None``, torch 2.13 and 2.15), so a
    call compiled after a backward could not be loaded. The same gradient objects are put back."""
    installed = {name: module.__dict__.pop(name) for name in INSTALLED if name in module.__dict__}
    grads = [(p, p.grad) for p in module.parameters() if p.grad is not None]
    for parameter, _ in grads:
        parameter.grad = None
    try:
        yield
    finally:
        module.__dict__.update(installed)
        for parameter, grad in grads:
            parameter.grad = grad


def compile_function(
    savable: Any,
    module: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    name_seed: str | None = None,
) -> Any:
    """``savable`` compiled for this call with ``aot_compile``, with the inductor cache in
    force: what :func:`build_entry` saves. With ``name_seed`` (the group's share key) the
    compiled graph's function is named after it (:func:`stable_compiled_fn_name`), so that
    torch's AOTAutograd cache key is the same on every rank: a rank whose caches hold another
    rank's entry (:func:`install_caches`) compiles the group again by tracing it and hitting
    that entry."""
    naming = stable_compiled_fn_name(name_seed) if name_seed else contextlib.nullcontext()
    with naming, warnings.catch_warnings():
        # Dynamo's guard builder reads .grad of non-leaf inputs while saving guards;
        # torch's warning about it says nothing the user can act on.
        warnings.filterwarnings("ignore", message="The .grad attribute of a Tensor that is not")
        with plain_module(module), trace_settings_of(savable):
            return savable.aot_compile(((module, *args), kwargs))


def build_entry(
    directory: Path,
    fields: dict[str, Any],
    savable: Any,
    shared: Callable[..., Any],
    module: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    name_seed: str | None = None,
) -> tuple[float, Any]:
    """Compile ``savable`` (the group function ``shared`` under ``torch.compile(fullgraph=True)``)
    for this call with ``aot_compile`` and write the entry into ``directory``, which is removed
    when that fails; returns the compile seconds and the compiled function as ``aot_compile``
    returned it (in this process its guards are the live ones: sharing through torch's caches
    serves the compiling rank from it, :mod:`torchkiln.jobs.share`)."""
    probes: dict[str, Any] = {}
    started = time.perf_counter()
    try:
        recording = recorded_probes(probes, fields["backend"], fields["device"])
        with apply_cache_dir(directory / KERNELS_DIR), recording:
            aot = compile_function(savable, module, args, kwargs, name_seed)
            aot.save_compiled_function(str(directory / ENTRY), external_data=closure_data(shared))
        seconds = time.perf_counter() - started
        meta = {
            "format": META_FORMAT,
            "fields": fields,
            "kind": fields["kind"],
            "compile_seconds": round(seconds, 3),
            "cpu_isa": probes or None,
            "entry": stored_file(directory, ENTRY).to_dict(),
            "kernels": [k.to_dict() for k in kernel_files(directory)],
        }
        write_meta(directory, meta)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return seconds, aot


def _checked_files(directory: Path) -> tuple[dict[str, Any], list[KernelFile], dict[str, bytes]]:
    """The entry's metadata, its kernels' records and every file it lists by path, each checked
    (:func:`read_entry`) before any is used."""
    meta = read_meta(directory)
    try:
        entry, kernels = KernelFile(**meta["entry"]), kernel_records(meta)
    except (KeyError, TypeError) as error:
        raise ArtifactError(f"entry metadata is malformed: {error}") from error
    return meta, kernels, {r.file: read_entry(directory, r) for r in (entry, *kernels)}


def pack_entry(directory: Path) -> bytes:
    """The entry as one message: its metadata and every file it lists, each checked first."""
    meta, _, files = _checked_files(directory)
    return pickle.dumps({"meta": meta, "files": files})


def unpack_entry(message: bytes, directory: Path) -> None:
    """Write a message of :func:`pack_entry` into the empty ``directory``; every path is
    confined to it. The files are checked against the metadata when loaded."""
    content = pickle.loads(message)
    for relative, data in content["files"].items():
        path = entry_path(directory, relative)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    write_meta(directory, content["meta"])


def install_caches(directory: Path, cache_dir: str | None) -> int:
    """The entry's kernels (torch's inductor and AOTAutograd cache files its compile wrote, and
    the compiled kernel libraries) merged into the inductor cache ``cache_dir``, each checked
    first; its saved function is not loaded. A normal compile of the group then finds them:
    sharing through torch's caches. Returns how many files were written.

    :raises ArtifactError: a file that does not match the metadata (nothing was copied).
    """
    _, kernels, _ = _checked_files(directory)
    return copy_kernels(directory, kernels, cache_dir)


def load_entry(directory: Path, shared: Callable[..., Any], cache_dir: str | None) -> Any:
    """The entry's kind, loaded function and closure (:func:`load_functions`).

    :raises ArtifactError: a file that does not match the metadata (nothing was loaded).
    """
    meta, kernels, files = _checked_files(directory)
    copy_kernels(directory, kernels, cache_dir)
    data = files[meta["entry"]["file"]]
    backend = meta.get("fields", {}).get("backend")
    return load_functions(shared, [(meta["kind"], data)], meta.get("cpu_isa"), backend)
