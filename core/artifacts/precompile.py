"""``torchkiln.precompile``: compile each region group ahead of time and write an artifact
directory that :func:`torchkiln.compile` (``artifacts=DIR``) loads without tracing or compiling.

The model is compiled by the same engine as :func:`torchkiln.compile` (same plan, same
``prepare_group`` preparations, same group function), with a group hook that, instead of
letting Dynamo compile on the first call, hands each distinct call of the group to torch's
``torch.compile(fn, fullgraph=True).aot_compile(((module, *args), kwargs))`` and saves the
result with ``save_compiled_function`` (guards included); the call itself then runs eagerly.
The model runs once per kind (inference, training) on ``example_inputs`` and is decompiled.
The inductor cache that compile filled is kept in ``DIR/kernels`` so loading compiles nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch
from torch import nn

from torchkiln._internals.versions import feature_problem
from torchkiln.artifacts.cache import apply_cache_dir
from torchkiln.artifacts.directory import (
    ARTIFACT_NAMES,
    GROUPS_DIR,
    KERNELS_DIR,
    KINDS,
    MANIFEST,
    ArtifactError,
    GroupArtifacts,
    GroupEntry,
    Manifest,
    class_name,
    closure_data,
    code_hash,
    entry_file,
    environment_key,
    error_reason,
    file_digest,
    input_spec,
    is_artifact_directory,
    kernel_files,
    read_manifest,
    structure_hash,
    write_manifest,
)
from torchkiln.artifacts.isa_probe import recorded_probes
from torchkiln.artifacts.whole_build import check_savable_backend
from torchkiln.configuration.config import CompileConfig
from torchkiln.engine.compile_state import REGION_ATTR, decompile, state_of
from torchkiln.engine.group_runtime import trace_settings_of
from torchkiln.engine.plan_check import select_plan
from torchkiln.engine.progress import make_progress
from torchkiln.engine.region_compiler import Compiler
from torchkiln.engine.resolve import ConfigArg, resolve_config
from torchkiln.plugin_host.default_manager import PluginsArg, as_plugin_manager
from torchkiln.plugin_host.plugin_manager import PluginManager
from torchkiln.plugin_host.region_plan import RegionGroup

INSTALLED = ("forward", REGION_ATTR)
MAX_VARIANTS = 4
"""At most this many distinct input specs are precompiled per group and kind."""


@attrs.define
class PrecompileResult:
    """What :func:`precompile` wrote, and what it could not."""

    path: str
    manifest: Manifest
    seconds: float

    @property
    def entries(self) -> int:
        return sum(len(g.entries) for g in self.manifest.groups)

    @property
    def skipped(self) -> list[dict[str, str]]:
        return self.manifest.skipped

    def summary(self) -> str:
        lines = [f"precompiled into {self.path} in {self.seconds:.1f} s:"]
        for group in self.manifest.groups:
            for entry in group.entries:
                lines.append(
                    f"  {group.name} ({group.regions} regions), {entry.kind}: "
                    f"{entry.compile_seconds:.1f} s -> {entry.file}"
                )
        for entry in (self.manifest.whole or {}).get("entries", []):
            lines.append(
                f"  the whole model, {entry['kind']}: {entry['compile_seconds']:.1f} s "
                f"-> {entry['file']}"
            )
        for skip in self.manifest.skipped:
            lines.append(f"  {skip['group']}, {skip['kind']}: NOT precompiled: {skip['reason']}")
        return "\n".join(lines)


def _as_call(example_inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A dict is keyword arguments, a tuple or list positional ones, anything else the one
    positional argument."""
    if isinstance(example_inputs, dict):
        return (), dict(example_inputs)
    if isinstance(example_inputs, tuple | list):
        return tuple(example_inputs), {}
    return (example_inputs,), {}


@contextlib.contextmanager
def kind_context(model: nn.Module, kind: str) -> Iterator[None]:
    """``inference``: eval mode, no grad. ``training``: train mode, grad enabled. The model's
    own modes are put back afterwards."""
    modes = {module: module.training for module in model.modules()}
    model.train(kind == "training")
    try:
        with torch.set_grad_enabled(kind == "training"):
            yield
    finally:
        for module, training in modes.items():
            module.training = training


@contextlib.contextmanager
def plain_module(module: nn.Module) -> Iterator[None]:
    """The module as the user built it while torch saves the guards: torch pickles the guarded
    module's ``__dict__``, which must not hold torchkiln's installed forward and region state
    (neither pickles, and neither exists in the loading process before compile)."""
    installed = {name: module.__dict__.pop(name) for name in INSTALLED if name in module.__dict__}
    try:
        yield
    finally:
        module.__dict__.update(installed)


def save_compiled_call(
    savable: Any,
    shared: Callable[..., Any],
    module: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    path: Path,
) -> float:
    """Compile ``savable`` (the group function ``shared`` under ``torch.compile``) for this
    call with ``aot_compile`` and save it at ``path``; returns the seconds the compile took."""
    started = time.perf_counter()
    with warnings.catch_warnings():
        # Dynamo's guard builder reads .grad of non-leaf inputs while saving guards; torch's
        # warning about it says nothing the user can act on.
        warnings.filterwarnings("ignore", message="The .grad attribute of a Tensor that is not")
        with plain_module(module), trace_settings_of(savable):
            aot = savable.aot_compile(((module, *args), kwargs))
        seconds = time.perf_counter() - started
        aot.save_compiled_function(str(path), external_data=closure_data(shared))
    return seconds


class EntryRecorder:
    """The group hook used while precompiling: records each distinct call of a group as a
    saved ``aot_compile`` entry, then runs the call eagerly."""

    def __init__(self, model: nn.Module, directory: Path, config: CompileConfig):
        self.model = model
        self.directory = directory
        self.config = config
        self.kind = KINDS[0]
        self.groups: dict[str, GroupArtifacts] = {}
        self.indexes: dict[str, int] = {}
        self.seen: set[tuple[str, str, str]] = set()
        self.skipped: list[dict[str, str]] = []

    def hook(self, group: RegionGroup, fn: Callable[..., Any], compiled: Any) -> Any:
        module = group.regions[0].module
        self.indexes[group.name] = len(self.indexes)
        self.groups[group.name] = GroupArtifacts(
            group.name,
            class_name(module),
            code_hash(module),
            structure_hash(module),
            len(group.regions),
        )

        def record(module: nn.Module, /, *args: Any, **kwargs: Any) -> Any:
            self._record(group, fn, compiled, module, args, kwargs)
            return fn(module, *args, **kwargs)

        return record

    def _record(
        self,
        group: RegionGroup,
        fn: Callable[..., Any],
        compiled: Any,
        module: nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        spec = input_spec(args, kwargs)
        key = (group.name, self.kind, repr(spec))
        saved = self.groups[group.name]
        variants = sum(1 for g, k, _ in self.seen if g == group.name and k == self.kind)
        if key in self.seen or variants >= MAX_VARIANTS:
            return
        self.seen.add(key)
        try:
            if not callable(getattr(compiled, "aot_compile", None)):
                raise ArtifactError(
                    f"compile_region for backend {self.config.backend!r} returned "
                    f"{type(compiled).__name__}, not a torch.compile function (no aot_compile)"
                )
            relative = entry_file(self.indexes[group.name], group.name, self.kind, variants)
            seconds = save_compiled_call(
                compiled, fn, module, args, kwargs, self.directory / relative
            )
            size, sha256 = file_digest(self.directory / relative)
        except Exception as error:  # one entry failing is recorded, the rest go on
            self.skipped.append(
                {"group": group.name, "kind": self.kind, "reason": error_reason(error)}
            )
            return
        saved.entries.append(
            GroupEntry(self.kind, relative, spec, round(seconds, 3), size=size, sha256=sha256)
        )


def _precompile_whole(
    model: nn.Module,
    plan: Any,
    config: CompileConfig,
    kinds: Sequence[str],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    directory: Path,
    plugins: PluginManager,
) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """The whole model, one function per kind, compiled by the backend's own plugin (the
    ``compile_region`` of ``plugins``' declaring plugin, as for the groups)."""
    from torchkiln.artifacts.whole_build import WHOLE_GROUP, Family, build_whole

    families = [Family(kind, kind == "training", args, kwargs) for kind in kinds]
    region_paths = [region.path for group in plan.groups for region in group.regions]
    built, skipped = build_whole(model, families, config, directory, region_paths, plugins)
    return built.to_dict(), [{"group": WHOLE_GROUP, **s} for s in skipped]


def _target_directory(path: str | Any) -> Path:
    """The absolute artifact directory for ``path``: new, empty, or written by precompile
    before (then replaced at the end); anything else is refused, untouched."""
    directory = Path(path).expanduser().resolve()
    if not directory.exists():
        return directory
    if not directory.is_dir():
        raise ArtifactError(f"artifacts path {str(path)!r} exists and is not a directory")
    try:
        names = sorted(os.listdir(directory))
    except OSError as error:
        raise ArtifactError(f"artifacts path {str(path)!r} cannot be read: {error}") from error
    if names and not is_artifact_directory(directory):
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        raise ArtifactError(
            f"artifacts path {str(path)!r} is not empty and is not a torchkiln artifact "
            f"directory (it holds {shown}); precompile writes a new or empty directory, or "
            "replaces one it wrote before (manifest.json, groups/, kernels/ only)"
        )
    return directory


def _staging_directory(directory: Path) -> Path:
    """A new hidden sibling of ``directory`` to write into, with the earlier artifacts'
    checked kernels (a warm inductor cache) when there are any."""
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(
            tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}.precompile-")
        )
    except OSError as error:
        raise ArtifactError(
            f"artifacts directory {str(directory)!r} cannot be written: {error.strerror or error}"
        ) from error
    (staging / GROUPS_DIR).mkdir()
    if directory.is_dir() and (directory / MANIFEST).exists():
        from torchkiln.artifacts.precompiled import copy_kernels

        with contextlib.suppress(ArtifactError, OSError):  # only a cold cache is lost
            copy_kernels(directory, read_manifest(directory).kernels, staging / KERNELS_DIR)
    return staging


def _exchange(first: Path, second: Path) -> bool:
    """Swap two paths in one step (Linux ``renameat2(RENAME_EXCHANGE)``); ``False`` where the
    system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_cwd, exchange = -100, 2
    return renameat2(at_cwd, bytes(first), at_cwd, bytes(second), exchange) == 0


def _directory_mode(directory: Path) -> int:
    """The replaced directory's permissions, else what ``mkdir`` would give under the umask."""
    if directory.exists():
        return directory.stat().st_mode & 0o7777
    umask = os.umask(0o022)  # read it back (os has no getter); restored on the next line
    os.umask(umask)
    return 0o777 & ~umask


def _commit(staging: Path, directory: Path) -> None:
    """Put the finished ``staging`` at ``directory`` (the manifest arrives last or with
    everything at once), then remove what it replaced."""
    os.chmod(staging, _directory_mode(directory))  # mkdtemp made it private
    if not directory.exists():
        os.rename(staging, directory)
        return
    if not os.listdir(directory):  # an empty directory (the working one, say): fill it
        for name in (*sorted(ARTIFACT_NAMES - {MANIFEST}), MANIFEST):  # the manifest last
            if (staging / name).exists():
                os.rename(staging / name, directory / name)
        staging.rmdir()
        return
    if not _exchange(staging, directory):
        old = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}.old-"))
        os.replace(directory, old)
        os.replace(staging, directory)
        staging = old
    shutil.rmtree(staging, ignore_errors=True)


def precompile(
    model: nn.Module,
    example_inputs: Any,
    path: str | Any,
    config: ConfigArg = None,
    *,
    kinds: Sequence[str] = KINDS,
    plugins: PluginsArg = None,
    whole: bool = False,
    **options: Any,
) -> PrecompileResult:
    """Compile every region group of ``model`` ahead of time and write them to ``path``.

    :param model: the plain model (not compiled by torchkiln), on the device and in the dtype
        it will run in.
    :param example_inputs: what the model is called with: a dict (keyword arguments), a tuple
        (positional arguments) or one value.
    :param path: the artifact directory: new, empty, or written by precompile before. The
        new artifacts are written into a hidden sibling directory and replace the earlier ones
        in one step at the end, so a failed or interrupted precompile leaves them as they were.
        A non-empty directory that is not an artifact directory is refused untouched.
    :param config: as :func:`torchkiln.compile`; ``options`` are ``CompileConfig`` fields.
    :param plugins: as :func:`torchkiln.compile` (a manager, or plugin objects); the configured
        backend's plugin compiles the groups and, with ``whole``, the whole model.
    :param kinds: ``inference`` (eval mode, no grad) and/or ``training`` (train mode, forward
        and backward). The model's modes are restored afterwards.
    :param whole: also compile the whole model, one function per kind (the form tiered
        compilation switches to); ``torchkiln.compile(artifacts=path)`` then prefers it to
        the region entries for every call it fits (docs/tiered.md).
    :return: a :class:`PrecompileResult`; an entry that could not be precompiled is listed in
        ``skipped`` with its reason (``torchkiln.compile`` then compiles that group normally).
    :raises ArtifactError: a torch without ``aot_compile`` (before 2.13), a backend that cannot
        serialise, a model already compiled, bad
        ``kinds``, a plan with nothing to compile, a nested (hierarchical) plan, or a ``path``
        that is not a directory precompile may write (or cannot be written).
    """
    started = time.perf_counter()
    missing = feature_problem("precompiled artifacts")
    if missing is not None:
        raise ArtifactError(f"torchkiln.precompile: {missing}")
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ArtifactError(f"kinds {list(kinds)!r}: choose one or both of {', '.join(KINDS)}")
    if state_of(model) is not None:
        raise ArtifactError(
            "precompile expects the plain model; this one is compiled by torchkiln "
            "(torchkiln.decompile(model) first)"
        )
    pm = as_plugin_manager(plugins).ensure_loaded()
    resolved = resolve_config(config, plugins=pm, **options)
    cfg = attrs.evolve(resolved.config, fullgraph=True, artifacts=None, progress="off")
    check_savable_backend(cfg, pm)
    plan = select_plan(model, resolved, pm)
    if plan.nested:
        raise ArtifactError(
            "precompile does not support nested (hierarchical) plans: the whole model is one "
            "Dynamo frame there; use the default selector"
        )
    if not plan.groups:
        raise ArtifactError(f"nothing to precompile: {plan.reason or 'the plan has no regions'}")
    directory = _target_directory(path)
    staging = _staging_directory(directory)
    try:
        manifest = _compile_into(staging, model, example_inputs, plan, cfg, pm, kinds, whole)
        try:
            _commit(staging, directory)
        except OSError as error:
            raise ArtifactError(
                f"artifacts directory {str(directory)!r} cannot be written: {error}"
            ) from error
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone after a commit; else the attempt
    return PrecompileResult(str(directory), manifest, time.perf_counter() - started)


def _compile_into(
    directory: Path,
    model: nn.Module,
    example_inputs: Any,
    plan: Any,
    cfg: CompileConfig,
    pm: PluginManager,
    kinds: Sequence[str],
    whole: bool = False,
) -> Manifest:
    """Compile and run ``model`` once per kind, writing entries, kernels and the manifest into
    ``directory``."""
    recorder = EntryRecorder(model, directory, cfg)
    compiler = Compiler(plan, cfg, pm, make_progress(cfg, plan))
    compiler.group_hooks.append(recorder.hook)
    args, kwargs = _as_call(example_inputs)
    first = plan.groups[0].regions[0].module  # the loader checks against the same module
    environment = environment_key(cfg, first)
    probes: dict[str, Any] = {}
    recording = recorded_probes(probes, environment["backend"], environment["device"])
    with apply_cache_dir(directory / KERNELS_DIR), recording:
        compiler(model)
        try:
            for kind in kinds:
                recorder.kind = kind
                with kind_context(model, kind):
                    model(*args, **kwargs)
        finally:
            decompile(model)
        whole_entry = (
            _precompile_whole(model, plan, cfg, kinds, args, kwargs, directory, pm)
            if whole
            else None
        )
    manifest = Manifest(environment=environment, skipped=recorder.skipped, cpu_isa=probes or None)
    if whole_entry is not None:
        manifest.whole, skipped_whole = whole_entry
        manifest.skipped += skipped_whole
    for name, group in recorder.groups.items():
        called = {entry.kind for entry in group.entries} | {
            s["kind"] for s in recorder.skipped if s["group"] == name
        }
        manifest.skipped += [
            {"group": name, "kind": kind, "reason": "not called by the example inputs"}
            for kind in kinds
            if kind not in called
        ]
    manifest.groups = [g for g in recorder.groups.values() if g.entries]
    manifest.kernels = kernel_files(directory)
    write_manifest(directory, manifest)
    return manifest
