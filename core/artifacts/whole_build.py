"""The whole-model form: compiling it ahead of time, and what it records.

A form is a store entry (``STORE/whole/<key>/``): its ``meta.json`` holds the environment key,
the ``whole`` record and every kernel, its compiled functions lie under ``whole/`` (torch's
``save_compiled_function``) and its kernels under ``kernels/``. Built by the tiered builder
process (:mod:`torchkiln.tiered.builder`) on a weightless copy of the model, and by ``torchkiln
precompile --whole`` on the model itself: each family of calls (:mod:`torchkiln.tiered.calls`)
becomes one ``aot_compile`` of :func:`whole_model_forward` with ``fullgraph=True``, compiled by
the configured backend's own ``compile_region`` (:func:`check_savable_backend`), with the guard
filter of :mod:`torchkiln.artifacts.whole_guards` in ``options``; an inductor ``mode`` reaches
it as the settings it stands for (:func:`whole_config`). The form fits a model when the class,
code, tree and structure hashes match (:func:`torchkiln.artifacts.whole_load.whole_mismatch`)."""

from __future__ import annotations

import hashlib
import sys
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import torch
from torch import nn

from torchkiln._internals import cache_entries, inductor
from torchkiln._internals.aot_artifacts import installed_module_globals
from torchkiln._internals.hub_kernels import name_function_modules
from torchkiln.artifacts.cache import apply_cache_dir
from torchkiln.artifacts.directory import (
    KERNELS_DIR,
    META_FORMAT,
    WHOLE_DIR,
    ArtifactError,
    class_name,
    code_hash,
    error_reason,
    hash_files,
    input_spec,
    installed_version,
    kernel_files,
    stored_file,
    structure_hash,
    write_meta,
)
from torchkiln.artifacts.isa_probe import recorded_probes
from torchkiln.artifacts.whole_guards import GuardFilter, referenced_files
from torchkiln.configuration.config import CompileConfig
from torchkiln.plugin_host.plugin_manager import PluginManager
from torchkiln.plugin_host.region_plan import Region, RegionGroup

WHOLE_GROUP = "<whole model>"
"""The name of the one-region group the whole model is compiled as (and of its skipped entries)."""

MAX_DEPTH = 6
"""How deep objects' attributes are walked for tensors (a cache's layers' keys are at 3)."""


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


def tree_hash(model: nn.Module) -> str:
    """SHA-256 over every submodule's path and class."""
    digest = hashlib.sha256()
    for path, module in model.named_modules():
        digest.update(f"{path}:{class_name(module)};".encode())
    return digest.hexdigest()


def whole_code_hash(model: nn.Module, files: Iterable[str]) -> str:
    """The model's code hash extended by the source files of the modules the trace reached."""
    return hash_files(hashlib.sha256(code_hash(model).encode()), files).hexdigest()


def package_versions(modules: Iterable[str]) -> dict[str, str]:
    """The installed version of each top-level package among ``modules`` that has one."""
    tops = sorted({m.split(".", 1)[0] for m in modules})
    return {top: version for top in tops if (version := installed_version(top)) is not None}


def walk(value: Any, path: str, depth: int) -> Iterator[tuple[str, Any]]:
    """``(path, leaf)`` for every tensor and plain leaf reachable from ``value``."""
    if (
        isinstance(value, torch.Tensor)
        or value is None
        or isinstance(value, bool | int | float | str | torch.dtype)
    ):
        yield path, value
    elif depth >= MAX_DEPTH:
        yield path, type(value)
    elif isinstance(value, list | tuple):
        yield path, (type(value), len(value))
        for index, item in enumerate(value):
            yield from walk(item, f"{path}[{index}]", depth + 1)
    elif isinstance(value, dict):
        yield path, (type(value), tuple(value))
        for key, item in value.items():
            yield from walk(item, f"{path}[{key!r}]", depth + 1)
    elif isinstance(value, nn.Module):
        yield path, type(value)
    else:
        fields = getattr(value, "__dict__", None)
        yield path, type(value)
        if isinstance(fields, dict):
            for key, item in fields.items():
                yield from walk(item, f"{path}.{key}", depth + 1)


def dynamic_cache_layer_types() -> tuple[type, ...]:
    """transformers' dynamic KV-cache layer class (``cache_utils.DynamicLayer``, its sliding
    window kinds are subclasses), when transformers is imported; else none."""
    module = sys.modules.get("transformers.cache_utils")
    layer = getattr(module, "DynamicLayer", None)
    return (layer,) if isinstance(layer, type) else ()


def contiguous_state(value: Any, depth: int = 0) -> int:
    """Make the non-contiguous tensors of every transformers dynamic KV-cache layer held in the
    call's arguments (a ``DynamicLayer``'s ``keys``) contiguous; returns how many were replaced.

    A cache's layout depends on who wrote it last: after the prefill a layer holds the key
    projection's transposed view, after a decode step the contiguous result of ``torch.cat``
    (and inductor-compiled code may choose either). A whole-model entry guards on strides, so
    one layout would miss the entry compiled for the other. Only such layers are touched: they
    replace these tensors themselves at every update (``torch.cat``), so nothing can alias them
    across calls; the values are unchanged, and the copy costs what the next step's ``cat``
    copies anyway. Any other object of the user's, and every tensor passed as an argument, is
    left exactly as it is: replacing its tensors would break the user's aliasing."""
    if depth >= MAX_DEPTH or isinstance(value, torch.Tensor | nn.Module):
        return 0
    if isinstance(value, list | tuple):
        return sum(contiguous_state(item, depth + 1) for item in value)
    if isinstance(value, dict):
        return sum(contiguous_state(item, depth + 1) for item in value.values())
    fields = getattr(value, "__dict__", None)
    if not isinstance(fields, dict):
        return 0
    if not isinstance(value, dynamic_cache_layer_types()):
        return sum(contiguous_state(item, depth + 1) for item in list(fields.values()))
    replaced = 0
    for key, item in list(fields.items()):
        if isinstance(item, torch.Tensor) and not item.is_contiguous():
            fields[key] = item.contiguous()
            replaced += 1
    return replaced


def whole_model_forward(module: nn.Module, /, *args: Any, **kwargs: Any) -> Any:
    """The function compiled for the whole model: the class's ``forward``, not an instance
    attribute, so the trace goes through every block's own code."""
    return type(module).forward(module, *args, **kwargs)


@attrs.define
class Family:
    """One family of calls to compile for: a representative call and its dynamic dims."""

    kind: str
    training: bool
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    dynamic: dict[str, tuple[int, ...]] = attrs.Factory(dict)


def check_savable_backend(config: CompileConfig, plugins: PluginManager) -> None:
    """Refuse a backend whose compiled functions cannot be saved (no plugin declares it, or
    its ``BackendSpec`` lacks ``precompile=True``), by name.

    :raises ArtifactError: naming the backend, its plugin and the backends that can save.
    """
    declared = plugins.backend(config.backend)
    if declared is not None and declared.spec.precompile:
        return
    savable = sorted(
        name for name, d in plugins.backends(include_torch=False).items() if d.spec.precompile
    )
    who = f"plugin {declared.plugin!r}" if declared is not None else "no plugin"
    raise ArtifactError(
        f"backend {config.backend!r} cannot be precompiled: {who} does not declare it "
        "serialisable (BackendSpec.precompile); `torchkiln plugins` lists the backends "
        f"that can ({', '.join(savable)})"
    )


def whole_config(config: CompileConfig, guard_filter: GuardFilter) -> CompileConfig:
    """The configuration the backend's ``compile_region`` gets for the whole model:
    ``fullgraph=True`` (``aot_compile`` refuses graph breaks) and ``guard_filter`` as the
    ``guard_filter_fn`` option.

    ``torch.compile`` refuses ``mode`` beside ``options``, and the guard filter can only be
    given in ``options``; so for inductor a ``mode`` becomes the inductor settings it stands
    for (what ``torch.compile`` itself applies for it), and ``mode`` is ``None``.

    :raises ArtifactError: a ``mode`` for another backend (torch has no settings to put in its
        place).
    """
    options = {**dict(config.options), "guard_filter_fn": guard_filter}
    mode = config.mode
    if mode is not None:
        if config.backend != "inductor":
            raise ArtifactError(
                f"mode {mode!r} for backend {config.backend!r}: the whole-model form needs a "
                "guard filter (torch.compile options guard_filter_fn), and torch.compile takes "
                "a mode or options, not both; only inductor's modes can be given as options. "
                "Leave mode unset for the whole-model form"
            )
        options = {**inductor.mode_options(mode, config.dynamic), **options}
        mode = None
    return attrs.evolve(config, fullgraph=True, mode=mode, options=options)


def _compile_one(
    model: nn.Module,
    family: Family,
    config: CompileConfig,
    plugins: PluginManager,
    group: RegionGroup,
) -> Any:
    """``config`` is :func:`whole_config`'s."""
    compiled = plugins.compile_region(
        fn=whole_model_forward, group=group, config=config, backend=config.backend
    )
    if not callable(getattr(compiled, "aot_compile", None)):
        declared = plugins.backend(config.backend)
        who = f"plugin {declared.plugin!r}" if declared is not None else "its plugin"
        raise ArtifactError(
            f"compile_region of {who} for backend {config.backend!r} returned "
            f"{type(compiled).__name__}, not a torch.compile function (no aot_compile), "
            "though the backend declares precompile=True"
        )
    model.train(family.training)
    for path, leaf in walk((family.args, family.kwargs), "", 0):  # the dims compiled dynamic
        if isinstance(leaf, torch.Tensor) and family.dynamic.get(path):
            cache_entries.mark_dynamic(leaf, list(family.dynamic[path]))
    with torch.set_grad_enabled(family.kind == "training"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The .grad attribute of a Tensor that is not")
        return compiled.aot_compile(((model, *family.args), family.kwargs))


def build_whole_form(
    model: nn.Module,
    families: list[Family],
    config: CompileConfig,
    directory: Path,
    region_paths: list[str],
    plugins: PluginManager,
    environment: dict[str, Any],
) -> tuple[WholeArtifacts, list[dict[str, str]]]:
    """Compile ``model`` for each family into the new ``directory`` as a store holds a
    whole-model form: the functions in ``whole/``, with the configured backend's
    ``compile_region`` as ``plugins`` serve it (:func:`check_savable_backend` first), inductor's
    cache in ``kernels/`` (and, for inductor on the CPU, the ISA probe's answers recorded), then
    the directory's ``meta.json``.

    :return: the ``whole`` manifest entry (its ``entries`` may be empty) and, per family that
        failed, ``{"kind", "reason"}``.
    :raises ArtifactError: a backend that cannot save.
    """
    check_savable_backend(config, plugins)
    name_function_modules(type(module).__module__ for module in model.modules())
    (directory / WHOLE_DIR).mkdir(parents=True, exist_ok=True)
    guard_filter = GuardFilter(region_paths)
    group = RegionGroup(
        WHOLE_GROUP,
        (Region("", model, WHOLE_GROUP),),
        "the whole model as one function (the whole-model form)",
    )
    entries: list[WholeEntry] = []
    skipped: list[dict[str, str]] = []
    probes: dict[str, Any] = {}
    training = model.training
    try:
        with (
            apply_cache_dir(directory / KERNELS_DIR),
            recorded_probes(probes, config.backend, environment["device"]),
        ):
            for index, family in enumerate(families):
                started = time.perf_counter()
                try:
                    cfg = whole_config(config, guard_filter)
                    aot = _compile_one(model, family, cfg, plugins, group)
                except Exception as error:  # one family failing is recorded, the others go on
                    skipped.append({"kind": family.kind, "reason": error_reason(error)})
                    continue
                seconds = time.perf_counter() - started
                relative = f"{WHOLE_DIR}/{family.kind}-{index}.bin"
                refs = installed_module_globals(aot, whole_model_forward.__globals__)
                aot.save_compiled_function(str(directory / relative))
                stored = stored_file(directory, relative)
                entries.append(
                    WholeEntry(
                        kind=family.kind,
                        training=family.training,
                        file=relative,
                        inputs=input_spec(family.args, family.kwargs),
                        dynamic={k: list(v) for k, v in family.dynamic.items()},
                        module_refs=refs,
                        compile_seconds=round(seconds, 3),
                        sha256=stored.sha256,
                        size=stored.size,
                    )
                )
    finally:
        model.train(training)
    modules = sorted(guard_filter.modules)
    whole = WholeArtifacts(
        cls=class_name(model),
        code_hash=whole_code_hash(model, referenced_files(modules)),
        tree_hash=tree_hash(model),
        structure_hash=structure_hash(model),
        region_paths=list(region_paths),
        modules=modules,
        packages=package_versions(modules),
        dropped_guards=dict(guard_filter.dropped),
        entries=entries,
    )
    meta = {
        "format": META_FORMAT,
        "environment": environment,
        "whole": whole.to_dict(),
        "cpu_isa": probes or None,
        "kernels": [k.to_dict() for k in kernel_files(directory)],  # every kernel, hashed
        "skipped": [{"group": WHOLE_GROUP, **s} for s in skipped],
    }
    write_meta(directory, meta)
    return whole, skipped
