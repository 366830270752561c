"""Installing the tiers on a model :func:`torchkiln.compile` has just compiled regionally."""

from __future__ import annotations

import warnings
from pathlib import Path

from torch import nn

from torchkiln.artifacts.directory import ArtifactError, read_meta
from torchkiln.configuration.config import CompileConfig
from torchkiln.engine.compile_state import MISSING, STATE_ATTR, CompileState, add_undo
from torchkiln.engine.states import State
from torchkiln.errors import TorchkilnError
from torchkiln.jobs.whole_store import whole_key, whole_section, whole_store
from torchkiln.plugin_host.region_plan import RegionPlan
from torchkiln.tiered.runtime import TieredForward


def check_plan_for_tiers(plan: RegionPlan) -> None:
    """:raises TorchkilnError: a plan the tiers cannot build on (before anything is touched)."""
    paths = [region.path for group in plan.groups for region in group.regions]
    if "" in paths:
        raise TorchkilnError(
            "tiered compilation needs a regional plan, but this plan compiles the whole model "
            "as one region (selector whole): use the default selector or turn tiered off"
        )
    if plan.nested:
        raise TorchkilnError(
            "tiered compilation does not combine with nested (hierarchical) plans, whose "
            "root is one Dynamo frame already: use the default selector"
        )


def _has_whole_entry(directory: Path) -> bool:
    try:
        return bool(read_meta(directory).get("whole"))
    except ArtifactError:
        return False  # the region loader warns about the directory itself


def whole_directory(
    config: CompileConfig, model: nn.Module, region_paths: list[str]
) -> Path | None:
    """Where a whole-model form for ``model`` already is: the precompiled directory's form for
    this model's key, else the store's; ``None`` when neither holds one."""
    sections = [whole_section(config.artifacts, writable=False)] if config.artifacts else []
    store = whole_store(config)
    sections += [store] if store is not None else []
    if not sections:
        return None  # nowhere to look: the key (it reads and hashes every source file) unmade
    key = whole_key(config, model, region_paths)
    for section in sections:
        found = section.find(key)
        if found is not None and _has_whole_entry(found):
            return found
    return None


def install_tiers(
    model: nn.Module, state: CompileState, config: CompileConfig
) -> TieredForward | None:
    """Tiers are installed when asked for, or when a whole-model form already exists (the
    artifact directory's or the store's: it is then preferred to the region entries)."""
    if not config.enabled:
        return None
    region_paths = [r.path for g in state.plan.groups for r in g.regions]
    existing = whole_directory(config, model, region_paths)
    if not config.tiered.enabled and existing is None:
        return None
    tiered = TieredForward(model, config, region_paths)
    exchange = getattr(state.job, "exchange", None)  # a job whose ranks share (torchkiln.jobs)
    if exchange is not None and exchange.world > 1:
        from torchkiln.tiered.job_tiers import JobTiers

        tiered.build.job = JobTiers(exchange)
    if existing is not None:
        _load_existing(tiered, model, existing)
    if not config.tiered.enabled and tiered.form is None:
        tiered.state = State.FAILED
    elif tiered.form is None:
        tiered.build.prestart(model)
    previous = model.__dict__.get("forward", MISSING)
    tiered.previous_forward = previous
    model.__dict__["forward"] = tiered
    # The state pickles after the forward, so loading a pickled model ends by restoring it.
    model.__dict__[STATE_ATTR] = model.__dict__.pop(STATE_ATTR)
    state.tiered = tiered

    def undo() -> None:
        tiered.stop()
        state.tiered = None
        if model.__dict__.get("forward") is tiered:
            del model.__dict__["forward"]
            if previous is not MISSING:
                model.__dict__["forward"] = previous

    add_undo(model, undo)
    return tiered


def _load_existing(tiered: TieredForward, model: nn.Module, directory: Path) -> None:
    from torchkiln.artifacts.precompiled import ArtifactWarning

    try:
        tiered.switch(model, directory, loaded=True)
    except Exception as error:  # torch raising while it rebuilds saved guards, say
        message = f"torchkiln: whole-model artifacts in {str(directory)!r} not used: {error}"
        if tiered.config.artifacts_strict:
            raise ArtifactError(
                message + " (artifacts_strict is set, so this is an error)"
            ) from error
        warnings.warn(message + "; serving regionally", ArtifactWarning, stacklevel=4)
        tiered.reason = str(error)
