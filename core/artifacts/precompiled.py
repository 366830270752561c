"""Loading precompiled artifacts into :func:`torchkiln.compile` (``artifacts=DIR``).

:class:`ArtifactSource` checks the directory's environment against the configuration and the
model once, then, per region group at compile time, checks the group's code and layout and
loads its compiled functions: a source of the group's code
(:class:`~torchkiln.engine.group_runtime.GroupCode` serves them, each call checked by their
saved guards). A call no artifact fits (another shape, grad mode, dtype) is never run by a
wrong function: it warns once and the backend compiles the group for such calls (under
``artifacts_strict`` it raises instead).
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import stat
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import torch
from torch import nn

from torchkiln.artifacts.cache import current_cache_dir
from torchkiln.artifacts.directory import (
    KERNELS_DIR,
    MANIFEST,
    ArtifactError,
    GroupArtifacts,
    KernelFile,
    Manifest,
    class_name,
    closure_data,
    code_hash,
    environment_key,
    environment_mismatches,
    read_entry,
    read_manifest,
    structure_hash,
    under,
)
from torchkiln.artifacts.isa_probe import answered_probes, machine_local
from torchkiln.configuration.config import CompileConfig
from torchkiln.engine.group_runtime import CodeSource, GroupCall, Loaded
from torchkiln.files import write_atomic
from torchkiln.plugin_host.region_plan import RegionGroup

logger = logging.getLogger("torchkiln")


class ArtifactWarning(UserWarning):
    """Precompiled artifacts that do not fit: torchkiln compiles normally instead."""


def copy_kernels(
    directory: Path, kernels: list[KernelFile], cache_dir: str | os.PathLike[str] | None = None
) -> int:
    """Merge the artifact directory's ``kernels`` (each checked by :func:`read_entry` first)
    into the inductor cache ``cache_dir`` (default: the cache in force); a regular file
    already there is kept (entries are
    content-addressed). Written as inductor writes its cache: a temporary file in the
    destination directory renamed into place, never through a link (a link planted in a
    shared cache is replaced, not followed; a linked directory is skipped). The ISA probe's
    load markers, which a directory written before torchkiln left them out may list, are not
    copied (:func:`torchkiln.artifacts.isa_probe.machine_local`). Returns how many files were
    written."""
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
    the generated module imports them."""
    from torchkiln.artifacts.deferred_templates import deferred_templates

    templates = deferred_templates() if backend == "inductor" else contextlib.nullcontext()
    with answered_probes(cpu_isa), templates:
        yield


class ArtifactSource(CodeSource):
    """Per compiled model: the directory checked once, groups loaded one by one."""

    def __init__(
        self,
        directory: str,
        strict: bool,
        config: CompileConfig,
        plugins: Any,
        cache_dir: str | None = None,
    ):
        self.directory = Path(directory).expanduser()
        self.name = f"artifacts {self.directory}"
        self.strict = strict
        self.config = config
        self.plugins = plugins
        self.cache_dir = cache_dir
        """The model's ``cache_dir`` (the kernels go there), else the cache in force."""
        self.manifest: Manifest | None = None
        self.loaded: dict[str, Loaded] = {}
        self.rejected: dict[str, str] = {}
        """Group name -> why its artifacts were not used."""
        self.load_seconds = 0.0
        self._checked = False
        self._kernels_copied = False

    def _reject(self, what: str, reason: str) -> None:
        message = f"torchkiln: artifacts in {str(self.directory)!r} not used for {what}: {reason}"
        if self.strict:
            raise ArtifactError(message + " (artifacts_strict is set, so this is an error)")
        warnings.warn(message + "; compiling normally", ArtifactWarning, stacklevel=5)

    def check(self, module: nn.Module, config: CompileConfig, plugins: Any) -> bool:
        """Read and check the manifest against ``config`` and the first group's ``module``
        (device and dtype), once."""
        if self._checked:
            return self.manifest is not None
        self._checked = True
        try:
            manifest = read_manifest(self.directory)
        except ArtifactError as error:
            self._reject("any group", str(error))
            return False
        except Exception as error:  # a broken directory is never blamed on a plugin
            self._reject("any group", f"{MANIFEST} cannot be read: {type(error).__name__}")
            return False
        declared = plugins.backend(config.backend)
        if declared is None or not getattr(declared.spec, "precompile", False):
            self._reject(
                "any group",
                f"backend {config.backend!r} does not declare that it can load precompiled "
                "functions (BackendSpec.precompile)",
            )
            return False
        current = environment_key(config, module)
        mismatches = environment_mismatches(manifest.environment, current)
        if mismatches:
            self._reject("any group", "; ".join(mismatches))
            return False
        self.manifest = manifest
        return True

    def load(self, call: GroupCall) -> Loaded | None:
        return self.loaded.get(call.group.name)

    def attach(self, group: RegionGroup, shared: Callable[..., Any]) -> bool:
        """Whether the group's artifacts fit and loaded, else ``False`` after a warning (an
        error under ``strict``): the group compiles as usual."""
        module = group.regions[0].module
        if not self.check(module, self.config, self.plugins):
            return False
        assert self.manifest is not None
        saved = self.manifest.group(group.name)
        reason = _group_mismatch(saved, module, self.manifest)
        if reason is None:
            assert saved is not None
            try:
                started = time.perf_counter()
                precompiled = self._load(saved, shared)
                self.load_seconds += time.perf_counter() - started
            except ArtifactError as error:  # refused by the integrity check: nothing was loaded
                reason = str(error)[:500]
            except Exception as error:
                reason = f"loading failed: {type(error).__name__}: {error}"[:500]
            else:
                self.loaded[group.name] = precompiled
                kinds = [kind for kind, _ in precompiled.functions]
                logger.info(
                    "torchkiln: group %r loaded from %s (%d precompiled functions: %s)",
                    group.name,
                    self.directory,
                    len(kinds),
                    ", ".join(kinds),
                )
                return True
        self.rejected[group.name] = reason
        self._reject(f"group {group.name!r}", reason)
        return False

    def _load(self, saved: GroupArtifacts, shared: Callable[..., Any]) -> Loaded:
        assert self.manifest is not None
        # Every entry is checked before the kernels are copied or anything is unpickled.
        data = [read_entry(self.directory, entry) for entry in saved.entries]
        if not self._kernels_copied:  # one kernels directory for all groups
            copy_kernels(self.directory, self.manifest.kernels, self.cache_dir)
            self._kernels_copied = True
        functions, closure = load_functions(
            shared,
            [(entry.kind, payload) for entry, payload in zip(saved.entries, data, strict=True)],
            self.manifest.cpu_isa,
            self.manifest.environment.get("backend"),
        )
        return Loaded(self.name, functions, closure, functools.partial(self._miss, saved.name))

    def _miss(self, group: str, reason: str | None) -> None:
        """A call no loaded function fits: warned once (the backend compiles such calls), an
        error on every call under ``strict``."""
        if reason is None:
            if self.strict:
                raise ArtifactError(f"precompiled group {group!r} does not fit this call")
            return
        message = (
            f"torchkiln: precompiled group {group!r} does not fit this call ({reason}); "
            "compiling it normally for such calls"
        )
        if self.strict:
            raise ArtifactError(message + " (artifacts_strict is set, so this is an error)")
        warnings.warn(message, ArtifactWarning, stacklevel=5)


def _group_mismatch(
    saved: GroupArtifacts | None, module: nn.Module, manifest: Manifest
) -> str | None:
    if saved is None:
        names = ", ".join(repr(g.name) for g in manifest.groups) or "none"
        skipped = manifest.skipped
        note = f" (precompile skipped: {skipped[0]['reason']})" if skipped else ""
        return f"no precompiled entry for this group (groups in the directory: {names}){note}"
    cls = class_name(module)
    if saved.cls != cls:
        return f"the group's class is {cls}, precompiled for {saved.cls}"
    if saved.code_hash != code_hash(module):
        return (
            "the source of the group's classes changed since it was precompiled (code hash differs)"
        )
    if saved.structure_hash != structure_hash(module):
        return "the group's parameters or buffers differ in names, shapes or dtypes"
    return None
