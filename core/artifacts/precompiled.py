"""Loading precompiled artifacts into :func:`torchkiln.compile` (``artifacts=DIR``).

:class:`ArtifactLoader` checks the directory's environment against the configuration and the
model once, then, per region group, checks the group's code and layout and loads its compiled
functions. The group's forward becomes a :class:`PrecompiledGroup`: on each call it evaluates
the saved guards of each loaded function (torch's C++ guard manager, the same check Dynamo
runs) and calls the first that matches; no Dynamo frame is entered. A call no artifact fits
(another shape, grad mode, dtype) is never run by a wrong function: it warns once and goes to
the group's normally compiled function, which traces and compiles as usual (under
``artifacts_strict`` it raises instead). That function is built on the first such call, not
before: a group whose calls all fit never builds a ``torch.compile`` wrapper, so loading does
not import the backend's compile stack (inductor's ``compile_fx``) for nothing.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import stat
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import torch
from torch import nn

from torchkiln._internals.aot_artifacts import loaded_guard_table
from torchkiln.artifacts.directory import (
    KERNELS_DIR,
    MANIFEST,
    ArtifactError,
    GroupArtifacts,
    KernelFile,
    Manifest,
    closure_data,
    code_hash,
    environment_key,
    environment_mismatches,
    read_entry,
    read_manifest,
    structure_hash,
)
from torchkiln.artifacts.isa_probe import answered_probes, machine_local
from torchkiln.configuration.config import CompileConfig
from torchkiln.plugin_host.region_plan import RegionGroup

logger = logging.getLogger("torchkiln")


class ArtifactWarning(UserWarning):
    """Precompiled artifacts that do not fit: torchkiln compiles normally instead."""


def copy_kernels(directory: Path, kernels: list[KernelFile], target: Path) -> int:
    """Merge the artifact directory's ``kernels`` (each checked by :func:`read_entry` first)
    into the inductor cache ``target``; a regular file already there is kept (entries are
    content-addressed). Written as inductor writes its cache: a temporary file in the
    destination directory renamed into place, never through a link (a link planted in a
    shared cache is replaced, not followed; a linked directory is skipped). The ISA probe's
    load markers, which a directory written before torchkiln left them out may list, are not
    copied (:func:`torchkiln.artifacts.isa_probe.machine_local`). Returns how many files were
    written."""
    copied = 0
    if kernels:
        target.mkdir(parents=True, exist_ok=True)
    for kernel in kernels:
        relative = PurePosixPath(kernel.file)
        if relative.parts[:1] != (KERNELS_DIR,) or len(relative.parts) < 2:
            raise ArtifactError(f"manifest kernel {kernel.file!r} is not under {KERNELS_DIR}/")
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
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=f".{relative.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(temporary, 0o644)  # as a cache file: readable by the ranks that share it
        os.replace(temporary, destination)  # replaces a link itself, never its target
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return True


class PrecompiledGroup:
    """A group's forward ``fn(module, *args, **kwargs)`` served by loaded functions.

    Each call builds the frame locals torch's guards read (``module``, ``args``, ``kwargs``
    and the closure) and calls the first loaded function whose guards pass
    (:class:`~torchkiln._internals.cache_entries.GuardTable`).
    """

    def __init__(
        self,
        group: str,
        entries: list[tuple[str, Any]],
        closure: dict[str, Any],
        compile_group: Callable[[], Callable[..., Any]],
        strict: bool,
        quiet: bool = False,
    ):
        self.group = group
        self.kinds = [kind for kind, _ in entries]
        self._table = loaded_guard_table(fn for _, fn in entries)
        self._closure = closure
        self._compile_group = compile_group
        self._fallback: Callable[..., Any] | None = None
        """The group's normally compiled function, built by the first call that needs it."""
        self._strict = strict
        self._quiet = quiet
        """Log, not warn, a call no loaded function fits (a job's shared entry covers the
        first call only: other shapes compile on the rank as usual, and the report counts them)."""
        self.hits = 0
        self.misses = 0
        self.miss_reason: str | None = None

    def __call__(self, module: nn.Module, /, *args: Any, **kwargs: Any) -> Any:
        f_locals = {**self._closure, "module": module, "args": args, "kwargs": kwargs}
        fn = self._table.find(f_locals)
        if fn is not None:
            self.hits += 1
            return fn(module, *args, **kwargs)
        return self._miss(f_locals, module, args, kwargs)

    def _miss(
        self, f_locals: dict[str, Any], module: nn.Module, args: Any, kwargs: dict[str, Any]
    ) -> Any:
        self.misses += 1
        if self.miss_reason is None:
            failures = self._table.first_failures(f_locals)
            self.miss_reason = "; ".join(
                f"{kind}: {(failed or 'guards pass')[:300]}"
                for kind, failed in zip(self.kinds, failures, strict=True)
            )
            message = (
                f"torchkiln: precompiled group {self.group!r} does not fit this call "
                f"({self.miss_reason}); compiling it normally for such calls"
            )
            if self._strict:
                raise ArtifactError(message + " (artifacts_strict is set, so this is an error)")
            if self._quiet:
                logger.info("%s", message)
            else:
                warnings.warn(message, ArtifactWarning, stacklevel=4)
        elif self._strict:
            raise ArtifactError(f"precompiled group {self.group!r} does not fit this call")
        if self._fallback is None:
            self._fallback = self._compile_group()
        return self._fallback(module, *args, **kwargs)


class ArtifactLoader:
    """Per compiled model: the directory checked once, groups loaded one by one."""

    def __init__(self, directory: str, strict: bool, cache_dir: str | None = None):
        self.directory = Path(directory).expanduser()
        self.strict = strict
        self.cache_dir = cache_dir
        """The model's ``cache_dir`` (the kernels go there), else the cache in force."""
        self.manifest: Manifest | None = None
        self.loaded: dict[str, PrecompiledGroup] = {}
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

    def load_group(
        self,
        group: RegionGroup,
        shared: Callable[..., Any],
        compile_group: Callable[[], Callable[..., Any]],
        config: CompileConfig,
        plugins: Any,
    ) -> PrecompiledGroup | None:
        """The group served by its loaded functions when its artifacts fit (``compile_group``
        builds the normally compiled function for the calls they do not fit), else ``None``
        after a warning (an error under ``strict``): the group compiles as usual."""
        module = group.regions[0].module
        if not self.check(module, config, plugins):
            return None
        assert self.manifest is not None
        saved = self.manifest.group(group.name)
        reason = _group_mismatch(saved, module, self.manifest)
        if reason is None:
            assert saved is not None
            try:
                started = time.perf_counter()
                precompiled = self._load(saved, shared, compile_group)
                self.load_seconds += time.perf_counter() - started
            except ArtifactError as error:  # refused by the integrity check: nothing was loaded
                reason = str(error)[:500]
            except Exception as error:
                reason = f"loading failed: {type(error).__name__}: {error}"[:500]
            else:
                self.loaded[group.name] = precompiled
                logger.info(
                    "torchkiln: group %r loaded from %s (%d precompiled functions: %s)",
                    group.name,
                    self.directory,
                    len(precompiled.kinds),
                    ", ".join(precompiled.kinds),
                )
                return precompiled
        self.rejected[group.name] = reason
        self._reject(f"group {group.name!r}", reason)
        return None

    def _load(
        self,
        saved: GroupArtifacts,
        shared: Callable[..., Any],
        compile_group: Callable[[], Callable[..., Any]],
    ) -> PrecompiledGroup:
        from torchkiln.artifacts.cache import current_cache_dir

        assert self.manifest is not None
        # Every entry is checked before the kernels are copied or anything is unpickled.
        data = [read_entry(self.directory, entry) for entry in saved.entries]
        if not self._kernels_copied:  # one kernels directory for all groups
            target = Path(self.cache_dir or current_cache_dir()).expanduser().resolve()
            copy_kernels(self.directory, self.manifest.kernels, target)
            self._kernels_copied = True
        closure = closure_data(shared)
        entries = []
        # Loading the first function loads its kernels, and inductor probes the CPU first.
        with answered_probes(self.manifest.cpu_isa), self._templates_deferred():
            for entry, payload in zip(saved.entries, data, strict=True):
                fn = torch.compiler.load_compiled_function(
                    io.BytesIO(payload), external_data=closure
                )
                entries.append((entry.kind, fn))
        names = shared.__code__.co_freevars
        frame_closure = {name: closure[f"closure:{name}"] for name in names}
        return PrecompiledGroup(saved.name, entries, frame_closure, compile_group, self.strict)

    def _templates_deferred(self) -> contextlib.AbstractContextManager[None]:
        """Inductor: its kernel templates, which a loaded function never renders, are parsed
        on first use rather than while the generated module imports them."""
        assert self.manifest is not None
        if self.manifest.environment.get("backend") != "inductor":
            return contextlib.nullcontext()
        from torchkiln.artifacts.deferred_templates import deferred_templates

        return deferred_templates()


def _group_mismatch(
    saved: GroupArtifacts | None, module: nn.Module, manifest: Manifest
) -> str | None:
    if saved is None:
        names = ", ".join(repr(g.name) for g in manifest.groups) or "none"
        skipped = [s for s in manifest.skipped]
        note = f" (precompile skipped: {skipped[0]['reason']})" if skipped else ""
        return f"no precompiled entry for this group (groups in the directory: {names}){note}"
    cls = f"{type(module).__module__}.{type(module).__qualname__}"
    if saved.cls != cls:
        return f"the group's class is {cls}, precompiled for {saved.cls}"
    if saved.code_hash != code_hash(module):
        return (
            "the source of the group's classes changed since it was precompiled (code hash differs)"
        )
    if saved.structure_hash != structure_hash(module):
        return "the group's parameters or buffers differ in names, shapes or dtypes"
    return None


def artifact_group_loader(config: CompileConfig, plugins: Any) -> Callable[..., Any]:
    """The :class:`~torchkiln.engine.region_compiler.Compiler` group loader for ``config.artifacts``."""
    assert config.artifacts is not None
    loader = ArtifactLoader(config.artifacts, config.artifacts_strict, config.cache_dir)

    def load(
        group: RegionGroup,
        shared: Callable[..., Any],
        compile_group: Callable[[], Any],
        compile_savable: Callable[[], Any],
    ) -> PrecompiledGroup | None:
        return loader.load_group(group, shared, compile_group, config, plugins)

    load.loader = loader  # type: ignore[attr-defined]
    return load
