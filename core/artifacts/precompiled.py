"""Loading saved compiled functions: their kernels merged into the inductor cache, each file
checked first, and the functions loaded with the closure their guards read (a store's entries,
:mod:`torchkiln.jobs.entry`, and whole-model forms, :mod:`torchkiln.artifacts.whole_load`).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import torch

from torchkiln._internals.fsdp import fsdp_classes_kept
from torchkiln.artifacts.cache import current_cache_dir
from torchkiln.artifacts.directory import (
    KERNELS_DIR,
    KernelFile,
    closure_data,
    read_entry,
    under,
)
from torchkiln.artifacts.isa_probe import answered_probes, machine_local
from torchkiln.files import write_atomic

logger = logging.getLogger("torchkiln")


class ArtifactWarning(UserWarning):
    """Precompiled artifacts that do not fit: torchkiln compiles normally instead."""


def copy_kernels(
    directory: Path, kernels: list[KernelFile], cache_dir: str | os.PathLike[str] | None = None
) -> int:
    """Merge the artifact directory's ``kernels`` (each checked by :func:`read_entry` first)
    into the inductor cache ``cache_dir`` (default: the cache in force); a regular file already
    there is kept (entries are content-addressed). Written as inductor writes its cache: a
    temporary file in the destination directory renamed into place, never through a link (a
    link planted in a shared cache is replaced, not followed; a linked directory is skipped).
    The ISA probe's load markers, which a directory written before torchkiln left them out may
    list, are not copied (:func:`~torchkiln.artifacts.isa_probe.machine_local`). Returns how
    many files were written."""
    copied = 0
    target = Path(cache_dir or current_cache_dir()).expanduser().resolve()
    if kernels:
        target.mkdir(parents=True, exist_ok=True)
    for kernel in kernels:
        relative = under(kernel.file, KERNELS_DIR)
        if machine_local(relative.name):
            continue
        data = read_entry(directory, kernel)
        if _write_new_file(target, PurePosixPath(*relative.parts[1:]), data):
            copied += 1
    return copied


def _write_new_file(target: Path, relative: PurePosixPath, data: bytes) -> bool:
    """``data`` at ``target/relative`` unless a regular file is there; ``False`` when kept or
    when a directory on the way is a link or not a directory (that file is left out)."""
    directory = target
    for part in relative.parts[:-1]:
        directory = directory / part
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory)
        if not stat.S_ISDIR(os.lstat(directory).st_mode):  # lstat: a link is not followed
            logger.warning("torchkiln: %s is not a directory; kernel not copied", directory)
            return False
    destination = directory / relative.name
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISREG(os.lstat(destination).st_mode):
            return False
    write_atomic(destination, data, mode=0o644)  # as a cache file: readable by every rank
    return True


def load_functions(
    shared: Callable[..., Any],
    payloads: list[tuple[str, bytes]],
    cpu_isa: Any,
    backend: str | None,
) -> tuple[list[tuple[str, Any]], dict[str, Any]]:
    """Saved functions (``(kind, bytes)``, each checked already) loaded for the group function
    ``shared``, with the closure its guards read; the kernels must be in the cache already."""
    closure = closure_data(shared)
    functions = []
    with loading(cpu_isa, backend):
        for kind, payload in payloads:
            fn = torch.compiler.load_compiled_function(io.BytesIO(payload), external_data=closure)
            functions.append((kind, fn))
    names = shared.__code__.co_freevars
    return functions, {name: closure[f"closure:{name}"] for name in names}


@contextlib.contextmanager
def loading(cpu_isa: Any, backend: str | None) -> Iterator[None]:
    """While saved functions load (the first loads its kernels, and inductor probes the CPU
    first): the probe answered from ``cpu_isa`` where it fits, and, for inductor, its kernel
    templates, which a loaded function never renders, parsed on first use rather than while
    the generated module imports them; an FSDP2 block's guards rebuilt against its own class
    (:func:`~torchkiln._internals.fsdp.fsdp_classes_kept`)."""
    from torchkiln.artifacts.deferred_templates import deferred_templates

    templates = deferred_templates() if backend == "inductor" else contextlib.nullcontext()
    with answered_probes(cpu_isa), templates, fsdp_classes_kept():
        yield
