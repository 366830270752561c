"""Compiling the whole model ahead of time into an artifact directory's ``whole`` entry.

Used by the tiered builder process (:mod:`torchkiln.tiered.builder`) on a hollow copy of the
model, and by ``torchkiln precompile --whole`` on the model itself. Each family of calls
(:mod:`torchkiln.tiered.calls`) becomes one ``aot_compile`` of :func:`whole_model_forward` with
``fullgraph=True``, the guards filtered as :mod:`torchkiln.tiered.guards` explains.
"""

from __future__ import annotations

import hashlib
import time
import warnings
from pathlib import Path
from typing import Any

import attrs
import torch
from torch import nn

from torchkiln.artifacts import input_spec, structure_hash
from torchkiln.config import CompileConfig
from torchkiln.tiered.artifacts import (
    WHOLE_DIR,
    WholeArtifacts,
    WholeEntry,
    class_name,
    package_versions,
    tree_hash,
    whole_code_hash,
)
from torchkiln.tiered.calls import mark_dynamic
from torchkiln.tiered.guards import GuardFilter, module_refs, referenced_files


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


def _compile_one(
    model: nn.Module, family: Family, config: CompileConfig, guard_filter: GuardFilter
) -> Any:
    options = {**dict(config.options), "guard_filter_fn": guard_filter}
    compiled = torch.compile(
        whole_model_forward,
        backend=config.backend,
        mode=config.mode,
        fullgraph=True,
        dynamic=config.dynamic,
        options=options,
    )
    model.train(family.training)
    mark_dynamic(family.args, family.kwargs, family.dynamic)
    with torch.set_grad_enabled(family.kind == "training"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The .grad attribute of a Tensor that is not")
        return compiled.aot_compile(((model, *family.args), family.kwargs))


def build_whole(
    model: nn.Module,
    families: list[Family],
    config: CompileConfig,
    directory: Path,
    region_paths: list[str],
) -> tuple[WholeArtifacts, list[dict[str, str]]]:
    """Compile ``model`` for each family into ``directory/whole/``.

    :return: the ``whole`` manifest entry (its ``entries`` may be empty) and, per family that
        failed, ``{"kind", "reason"}``.
    """
    (directory / WHOLE_DIR).mkdir(parents=True, exist_ok=True)
    guard_filter = GuardFilter(region_paths)
    entries: list[WholeEntry] = []
    skipped: list[dict[str, str]] = []
    training = model.training
    try:
        for index, family in enumerate(families):
            started = time.perf_counter()
            try:
                aot = _compile_one(model, family, config, guard_filter)
            except Exception as error:  # one family failing is recorded, the others go on
                skipped.append({"kind": family.kind, "reason": _reason(error)})
                continue
            seconds = time.perf_counter() - started
            relative = f"{WHOLE_DIR}/{family.kind}-{index}.bin"
            env = aot._artifacts.runtime_env
            refs = module_refs(whole_model_forward.__globals__, env.external_refs)
            aot.save_compiled_function(str(directory / relative))
            data = (directory / relative).read_bytes()
            entries.append(
                WholeEntry(
                    kind=family.kind,
                    training=family.training,
                    file=relative,
                    inputs=input_spec(family.args, family.kwargs),
                    dynamic={k: list(v) for k, v in family.dynamic.items()},
                    module_refs=refs,
                    compile_seconds=round(seconds, 3),
                    sha256=hashlib.sha256(data).hexdigest(),
                    size=len(data),
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
    return whole, skipped


def _reason(error: BaseException) -> str:
    first = next((line for line in str(error).splitlines() if line.strip()), "")
    return f"{type(error).__name__}: {first}"[:500]
