"""Built-in plugin: the ``fsdp2`` distributed strategy (``torch.distributed.fsdp.fully_shard``).

Order (the one torchtitan proved): optional activation checkpointing of each region, then
in-place compile of each region, then ``fully_shard`` on each region and finally on the root.
Compiling before sharding keeps FSDP2's parameter all-gather / reshard hooks *outside* the
compiled code: they are module hooks, and ``nn.Module.__call__`` runs them eagerly around the
region's compiled ``forward``, so a block's parameters are gathered before it runs and
resharded after, exactly as without compilation.

Activation checkpointing (:func:`prepare_group`) puts ``torch.utils.checkpoint`` (non-reentrant)
*inside* each group's traced function, torchtitan's "wrap, then compile": Dynamo captures it as
one checkpointed subgraph and the backend compiles the recomputation with the forward. Nothing is
wrapped or renamed, so the state-dict keys stay the plain model's (no
``_checkpoint_wrapped_module.``). Two mechanisms that fail were measured (docs/distributed.md):
torch's composable ``checkpoint`` around an inductor-compiled block, and ``torch.utils.checkpoint``
around the compiled call, both recompute other tensors than the forward saved (pytorch#166926,
``CheckpointError`` at the first backward). The composable form serves only where nothing is
compiled (``disable``).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from torchkiln import is_compiled
from torchkiln._internals import dynamo
from torchkiln._internals.fsdp import checkpoint_activations
from torchkiln.plugin import (
    CompileConfig,
    DistributedError,
    DistributedResult,
    DistributedSpec,
    FSDP2Config,
    FSDP2MixedPrecision,
    GroupPreparation,
    RegionFunction,
    RegionPlan,
    add_undo,
    check_not_wrapped,
    check_options,
    hold_setting,
    hookimpl,
    require_process_group,
)

STRATEGY = "fsdp2"
BACKEND_DEVICES = {"gloo": "cpu", "mpi": "cpu", "nccl": "cuda", "xccl": "xpu", "hccl": "hpu"}
DYNAMO_FLAGS = ("capture_scalar_outputs", "skip_fwd_side_effects_in_bwd_under_checkpoint")
"""Set to ``True`` with ``distributed.fsdp2.dynamo_flags``; the second only where torch has it."""
CHECKPOINT_TRACE_FLAG = "skip_fwd_side_effects_in_bwd_under_checkpoint"
"""Set while a checkpointed group traces (only then): without it Dynamo refuses the checkpointed
subgraph of a transformers block ("HOP: Unsafe side effect", a ContextVar read) and the block
runs eagerly, its activations checkpointed but nothing compiled."""


@hookimpl
def declare_distributed() -> list[DistributedSpec]:
    return [
        DistributedSpec(
            STRATEGY,
            "FSDP2 fully_shard: checkpointing, in-place compile, then shard each region and the root",
        )
    ]


def mesh_device_type(settings: FSDP2Config, model: nn.Module) -> str:
    """The device mesh's type: ``distributed.fsdp2.mesh_device``, else the process group's
    device (``cpu`` for gloo). ``init_device_mesh``'s own default is the accelerator, which
    a gloo process group cannot serve."""
    if settings.mesh_device:
        return settings.mesh_device
    backend = str(torch.distributed.get_backend())
    model_device = next((p.device.type for p in model.parameters()), "cpu")
    if ":" in backend:  # one backend per device type: "cpu:gloo,cuda:nccl"
        devices = [part.split(":", 1)[0] for part in backend.split(",")]
        if model_device in devices:
            return model_device
        return next((d for d in devices if d != "cpu"), "cpu")
    return BACKEND_DEVICES.get(backend, model_device)


def set_dynamo_flags(model: nn.Module) -> Callable[[], None]:
    """Turn the :data:`DYNAMO_FLAGS` on for as long as ``model`` holds them; return the
    (idempotent) undo, which also runs when ``model`` is garbage collected. Two sharded models
    hold the flags together: they go back to their start values when the last lets go."""
    dynamo_config = dynamo.config()
    holds = [
        hold_setting(
            f"dynamo:{name}",
            True,
            functools.partial(getattr, dynamo_config, name),
            functools.partial(setattr, dynamo_config, name),
        )
        for name in DYNAMO_FLAGS
        if hasattr(dynamo_config, name)
    ]
    return weakref.finalize(model, _release, holds)


def _release(holds: list[Any]) -> None:
    for held in reversed(holds):
        held.release()


def checkpointed(traced: RegionFunction) -> RegionFunction:
    """``traced`` (the group's function, traced by Dynamo) run inside ``torch.utils.checkpoint``:
    its activations are recomputed when the backward needs them, by compiled code too (the RNG
    state is replayed, so dropout recomputes the same mask)."""
    from torch.utils.checkpoint import checkpoint

    def checkpointed_call(module: nn.Module, /, *args: Any, **kwargs: Any) -> Any:
        return checkpoint(traced, module, *args, use_reentrant=False, **kwargs)

    return checkpointed_call


def checkpoint_trace_settings() -> Any:
    """The Dynamo setting a checkpointed group traces in (:data:`CHECKPOINT_TRACE_FLAG`)."""
    return dynamo.config_patch(**{CHECKPOINT_TRACE_FLAG: True})


@hookimpl(trylast=True)  # innermost: other wrappers (Accelerate's hooks) run once, outside it
def prepare_group(config: CompileConfig) -> GroupPreparation | None:
    """Activation checkpointing around each compiled region of an ``fsdp2`` compile."""
    if (
        config.distributed.strategy != STRATEGY
        or not config.distributed.fsdp2.activation_checkpointing
    ):
        return None
    return GroupPreparation(
        wrap_traced=checkpointed,
        trace_settings=checkpoint_trace_settings,
        notes=["activation checkpointing: torch.utils.checkpoint traced into the compiled code"],
    )


def _shard(model: nn.Module, paths: list[str], kwargs: dict[str, Any]) -> None:
    from torch.distributed.fsdp import fully_shard

    # Deepest first: a module's fully_shard leaves out parameters its sharded children manage.
    for path in sorted((p for p in paths if p), key=lambda p: -p.count(".")):
        fully_shard(model.get_submodule(path), **kwargs)
    fully_shard(model, **kwargs)


def mixed_precision_policy(settings: FSDP2MixedPrecision) -> Any:
    """``MixedPrecisionPolicy`` from dtype names (validated against FLOAT_DTYPES already)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    def dtype(name: str | None) -> torch.dtype | None:
        return None if name is None else getattr(torch, name)

    return MixedPrecisionPolicy(
        param_dtype=dtype(settings.param_dtype),
        reduce_dtype=dtype(settings.reduce_dtype),
        output_dtype=dtype(settings.output_dtype),
        cast_forward_inputs=settings.cast_forward_inputs,
    )


def shard_kwargs(config: CompileConfig, model: nn.Module) -> dict[str, Any]:
    from torch.distributed.fsdp import fully_shard

    settings = config.distributed.fsdp2
    kwargs: dict[str, Any] = {"reshard_after_forward": settings.reshard_after_forward}
    if not settings.mixed_precision.is_default():
        kwargs["mp_policy"] = mixed_precision_policy(settings.mixed_precision)
    kwargs.update(  # distributed.options (an mp_policy object, say) win over the section
        check_options(
            STRATEGY, "fully_shard", fully_shard, config.distributed.options, reserved=("module",)
        )
    )
    if kwargs.get("mesh") is None:
        kwargs["mesh"] = device_mesh(mesh_device_type(settings, model), settings.replicate_degree)
    return kwargs


def device_mesh(device_type: str, replicate_degree: int) -> Any:
    """1-D over every rank (FSDP), or 2-D ``(replicate, shard)`` for HSDP."""
    from torch.distributed.device_mesh import init_device_mesh

    world = torch.distributed.get_world_size()
    if replicate_degree == 1:
        return init_device_mesh(device_type, (world,))
    if world % replicate_degree:
        raise DistributedError(
            f"distributed.fsdp2.replicate_degree={replicate_degree} does not divide the world "
            f"size {world}: HSDP needs world_size = replicate_degree x shard size"
        )
    return init_device_mesh(
        device_type,
        (replicate_degree, world // replicate_degree),
        mesh_dim_names=("replicate", "shard"),
    )


@hookimpl
def wrap_distributed(
    model: nn.Module,
    config: CompileConfig,
    plan: RegionPlan,
    compile_regions: Callable[[nn.Module], None],
) -> DistributedResult:
    require_process_group(STRATEGY)
    check_not_wrapped(model, STRATEGY)
    settings = config.distributed.fsdp2
    kwargs = shard_kwargs(config, model)
    paths = list(dict.fromkeys(region.path for region in plan.regions()))
    compile_regions(model)
    if settings.activation_checkpointing and not is_compiled(model):
        for path in paths:  # nothing compiled (``disable``): torch's composable checkpoint
            checkpoint_activations(model.get_submodule(path))
    if settings.dynamo_flags and is_compiled(model):
        add_undo(model, set_dynamo_flags(model))
    _shard(model, paths, kwargs)
    return DistributedResult(wrapped=model, module=model, strategy=STRATEGY)
