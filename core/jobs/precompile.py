"""``torchkiln.precompile``: compile each region group ahead of time into a store that
:func:`torchkiln.compile` loads without tracing or compiling (``artifacts=DIR``, or ``store=DIR``).

The model is compiled by the same engine as :func:`torchkiln.compile` (same plan, same
``prepare_group`` preparations, same group function), with a ``compile_region`` wrapper
(:class:`EntryRecorder`, registered for the precompile only) that hands each distinct call of a
group to torch's ``aot_compile`` and publishes the saved function as a store
entry (:mod:`torchkiln.jobs.entry`: ``entries/<key>/``, its kernels inside); the call itself
then runs eagerly. The model runs once per kind (inference, training) on ``example_inputs`` and
is decompiled. With ``whole``, the whole model's form goes to ``whole/<key>/``. Each entry is
published with one rename and never changed: an interrupted precompile leaves what was there.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch
from torch import nn

from torchkiln._internals.versions import feature_problem
from torchkiln.artifacts.directory import (
    KINDS,
    ArtifactError,
    environment_key,
    error_reason,
    input_spec,
)
from torchkiln.artifacts.whole_build import (
    WHOLE_GROUP,
    Family,
    build_whole_form,
    check_savable_backend,
)
from torchkiln.configuration.config import CompileConfig
from torchkiln.configuration.store_layout import KERNELS, WHOLE
from torchkiln.engine.compile_state import decompile, state_of
from torchkiln.engine.dynamo_records import trace_settings_entered
from torchkiln.engine.plan_check import select_plan
from torchkiln.engine.progress import make_progress
from torchkiln.engine.region_compiler import Compiler
from torchkiln.engine.resolve import ConfigArg, resolve_config
from torchkiln.engine.saved_guards import saving_config
from torchkiln.jobs.entry import build_entry
from torchkiln.jobs.keys import share_fields, share_key
from torchkiln.jobs.store import ENTRIES, JobStore
from torchkiln.jobs.whole_store import whole_key, whole_section
from torchkiln.plugin_host.default_manager import PluginsArg, as_plugin_manager
from torchkiln.plugin_host.hooks import hookimpl
from torchkiln.plugin_host.region_plan import RegionGroup

MAX_VARIANTS = 4
"""At most this many distinct input specs are precompiled per group and kind."""
STORE_NAMES = frozenset({ENTRIES, WHOLE, KERNELS})
"""What a store holds at its top level: the directories precompile may add to."""


@attrs.define
class PrecompiledEntry:
    """One function :func:`precompile` put in the directory (or found there already)."""

    group: str
    kind: str
    inputs: list[str]
    path: str
    compile_seconds: float
    """0 when the directory had it already."""


@attrs.define
class PrecompileResult:
    """What :func:`precompile` wrote, and what it could not."""

    path: str
    groups: list[PrecompiledEntry] = attrs.Factory(list)
    whole: list[PrecompiledEntry] = attrs.Factory(list)
    skipped: list[dict[str, str]] = attrs.Factory(list)
    """``{"group", "kind", "reason"}`` for every entry that could not be precompiled."""
    seconds: float = 0.0

    @property
    def entries(self) -> int:
        return len(self.groups)

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)

    def summary(self) -> str:
        lines = [f"precompiled into {self.path} in {self.seconds:.1f} s:"]
        for entry in self.groups:
            lines.append(
                f"  {entry.group}, {entry.kind}: {entry.compile_seconds:.1f} s -> {entry.path}"
            )
        for entry in self.whole:
            lines.append(
                f"  the whole model, {entry.kind}: {entry.compile_seconds:.1f} s -> {entry.path}"
            )
        for skip in self.skipped:
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


class EntryRecorder:
    """A ``compile_region`` wrapper, registered while precompiling: each group's compiled
    function is replaced by one that publishes each distinct call of the group as a store entry,
    then runs the call eagerly. The hook of the design, as any plugin would wrap it: the
    compiler knows nothing of precompiling."""

    def __init__(self, store: JobStore, config: CompileConfig):
        self.store = store
        self.config = config
        self.kind = KINDS[0]
        self.groups: list[str] = []
        self.entries: list[PrecompiledEntry] = []
        self.seen: set[tuple[str, str, str]] = set()
        self.skipped: list[dict[str, str]] = []

    @hookimpl(wrapper=True)
    def compile_region(
        self, fn: Callable[..., Any], group: RegionGroup
    ) -> Generator[None, Any, Any]:
        compiled = yield
        self.groups.append(group.name)

        def record(module: nn.Module, /, *args: Any, **kwargs: Any) -> Any:
            self._record(group.name, fn, compiled, module, args, kwargs)
            return fn(module, *args, **kwargs)

        return record

    def _record(
        self,
        group: str,
        fn: Callable[..., Any],
        compiled: Any,
        module: nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        spec = repr(input_spec(args, kwargs))
        variants = sum(1 for g, k, _ in self.seen if (g, k) == (group, self.kind))
        if (group, self.kind, spec) in self.seen or variants >= MAX_VARIANTS:
            return
        self.seen.add((group, self.kind, spec))
        try:
            if not callable(getattr(compiled, "aot_compile", None)):
                raise ArtifactError(
                    f"compile_region for backend {self.config.backend!r} returned "
                    f"{type(compiled).__name__}, not a torch.compile function (no aot_compile)"
                )
            fields = share_fields(self.config, group, module, fn, args, kwargs)
            key = share_key(fields)
            seconds, path = 0.0, self.store.find(key)
            if path is None:  # an earlier precompile may have written it: kept as it is
                staging = self.store.staging(key)
                # The group's trace settings (layer_idx symbolic), as its Dynamo compiles get.
                with trace_settings_entered(fn.__code__.co_name):
                    seconds, _ = build_entry(staging, fields, compiled, fn, module, args, kwargs)
                path = self.store.publish(staging, key)
        except Exception as error:  # one entry failing is recorded, the rest go on
            self.skipped.append({"group": group, "kind": self.kind, "reason": error_reason(error)})
            return
        relative = path.relative_to(self.store.root).as_posix()
        self.entries.append(
            PrecompiledEntry(group, self.kind, fields["inputs"], relative, round(seconds, 3))
        )


def _precompile_whole(
    model: nn.Module,
    plan: Any,
    config: CompileConfig,
    kinds: Sequence[str],
    call: tuple[tuple[Any, ...], dict[str, Any]],
    directory: Path,
    plugins: Any,
) -> tuple[list[PrecompiledEntry], list[dict[str, str]]]:
    """The whole model, one function per kind, compiled by the backend's own plugin, into the
    store's ``whole/<key>/`` (kept as it is when an earlier precompile wrote it)."""
    region_paths = [region.path for group in plan.groups for region in group.regions]
    section = whole_section(directory)
    key = whole_key(config, model, region_paths)
    relative = f"{WHOLE}/{key}"
    if section.find(key) is not None:
        return [PrecompiledEntry(WHOLE_GROUP, kind, [], relative, 0.0) for kind in kinds], []
    families = [Family(kind, kind == "training", *call) for kind in kinds]
    staging = section.staging(key)
    try:
        environment = environment_key(config, model)
        built, skipped = build_whole_form(
            model, families, config, staging, region_paths, plugins, environment
        )
        if built.entries:
            section.publish(staging, key)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone after a publish; else the attempt
    entries = [
        PrecompiledEntry(WHOLE_GROUP, e.kind, e.inputs, relative, e.compile_seconds)
        for e in built.entries
    ]
    return entries, [{"group": WHOLE_GROUP, **s} for s in skipped]


def _target_directory(path: str | Any) -> Path:
    """The absolute directory for ``path``: new, empty, or a store (precompile adds to it);
    anything else is refused, untouched."""
    directory = Path(path).expanduser().resolve()
    if not directory.exists():
        return directory
    if not directory.is_dir():
        raise ArtifactError(f"artifacts path {str(path)!r} exists and is not a directory")
    try:
        names = sorted(os.listdir(directory))
    except OSError as error:
        raise ArtifactError(f"artifacts path {str(path)!r} cannot be read: {error}") from error
    if not set(names) <= STORE_NAMES:
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        raise ArtifactError(
            f"artifacts path {str(path)!r} is not empty and is not a torchkiln store (it "
            f"holds {shown}); precompile writes a new or empty directory, or adds to a store "
            f"({', '.join(sorted(STORE_NAMES))} only)"
        )
    return directory


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
    """Compile every region group of ``model`` ahead of time into the store at ``path``.

    :param model: the plain model (not compiled by torchkiln), on the device and in the dtype
        it will run in.
    :param example_inputs: what the model is called with: a dict (keyword arguments), a tuple
        (positional arguments) or one value.
    :param path: the directory: new, empty, or a store (written by precompile or by a run with
        ``store=``). Each entry is published on its own with one rename and never changed, so
        a failed or interrupted precompile leaves the entries that were there. A non-empty
        directory that is not a store is refused untouched.
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
        serialise, a model already compiled, bad ``kinds``, a plan with nothing to compile, a
        nested (hierarchical) plan, or a ``path`` that is not a directory precompile may write
        (or cannot be written).
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
    try:
        store = JobStore(directory)
    except ArtifactError as error:
        raise ArtifactError(
            f"artifacts directory {str(directory)!r} cannot be written: {error.__cause__ or error}"
        ) from error
    recorder = EntryRecorder(store, cfg)
    # Keys are the configuration's; the groups compile under saving_config (its guard filter).
    compiler = Compiler(plan, saving_config(cfg), pm, make_progress(cfg, plan))
    call = _as_call(example_inputs)
    recording = pm.register(recorder, name="torchkiln.precompile")
    try:
        compiler(model)  # each group's compile_region, inside the recorder's wrapper
        for kind in kinds:
            recorder.kind = kind
            with kind_context(model, kind):
                model(*call[0], **call[1])
    finally:
        pm.unregister(name=recording)
        decompile(model)
    result = PrecompileResult(str(directory), recorder.entries, skipped=recorder.skipped)
    if whole:
        result.whole, skipped = _precompile_whole(model, plan, cfg, kinds, call, directory, pm)
        result.skipped += skipped
    for name in recorder.groups:
        called = {e.kind for e in recorder.entries if e.group == name}
        called |= {s["kind"] for s in recorder.skipped if s["group"] == name}
        result.skipped += [
            {"group": name, "kind": kind, "reason": "not called by the example inputs"}
            for kind in kinds
            if kind not in called
        ]
    result.seconds = time.perf_counter() - started
    return result
