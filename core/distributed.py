"""What a distributed wrapper returns, and how users get the plain module back
(:func:`unwrap`, :func:`full_state_dict`, :func:`distributed_result`).

The checks every strategy, built-in or third-party, runs live here too, so that all fail the
same way: :func:`require_process_group`, :func:`check_not_wrapped`, :func:`check_result`.
Nothing here imports DeepSpeed (:func:`is_deepspeed_engine` looks in ``sys.modules`` first).
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from torchkiln._internals import dynamo
from torchkiln.errors import DistributedError
from torchkiln.plugin_host.distributed_result import DistributedResult as _DistributedResult
from torchkiln.v1_compat import v1_names

RESULT_ATTR = "_torchkiln_distributed"
"""Key in a returned wrapper's ``__dict__`` holding its :class:`DistributedResult`."""
WRAPPED_BY_ATTR = "_torchkiln_wrapped_by"
"""Key in a plain module's ``__dict__``: a weak reference to the live wrapper around it."""


# --- launch checks ----------------------------------------------------------------------------

LAUNCH_HINT = (
    "Launch the script with one process per device, e.g. "
    "`torchrun --nproc_per_node=2 script.py` (several machines: add --nnodes, --node_rank and "
    "--rdzv_endpoint), and call `torch.distributed.init_process_group()` (backend 'nccl' on "
    "GPUs, 'gloo' on CPU) before torchkiln.compile; or initialise it yourself with "
    "`torch.distributed.init_process_group(backend, init_method=..., rank=..., world_size=...)`."
)
LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def process_group_ready() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def launched_by_launcher(env: Mapping[str, str]) -> bool:
    """Whether ``torchrun`` or the ``deepspeed`` launcher started this process."""
    return all(env.get(name) for name in LAUNCHER_ENV)


def require_process_group(strategy: str) -> None:
    """Raise :class:`DistributedError`, saying how to launch, when no process group exists."""
    if not torch.distributed.is_available():
        raise DistributedError(
            f"distributed strategy {strategy!r} needs torch.distributed, which this torch build "
            "does not include (torch.distributed.is_available() is False)"
        )
    if not torch.distributed.is_initialized():
        raise DistributedError(
            f"distributed strategy {strategy!r} needs an initialised process group and there is "
            f"none. {LAUNCH_HINT}"
        )


# --- what wraps what --------------------------------------------------------------------------


def is_deepspeed_engine(obj: Any) -> bool:
    if "deepspeed" not in sys.modules:
        return False  # no engine can exist before deepspeed is imported
    from deepspeed.runtime.engine import DeepSpeedEngine

    return isinstance(obj, DeepSpeedEngine)


def is_fsdp2(module: Any) -> bool:
    """Whether ``module`` or one of its submodules was sharded by FSDP2's ``fully_shard``."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, nn.Module) and any(
        isinstance(m, FSDPModule) for m in module.modules()
    )


def _inner(obj: Any) -> tuple[str, Any] | None:
    """One wrapper layer: its name and what it wraps, or ``None`` for a plain module."""
    if isinstance(obj, dynamo.optimized_module_type()):
        return "torch.compile (OptimizedModule)", dynamo.original_module(obj)
    return container_layer(obj)


def container_layer(obj: Any) -> tuple[str, Any] | None:
    """One parallel-container layer (DDP, DataParallel, DeepSpeed, FSDP v1): its name and its
    ``.module``; ``None`` for anything else, a ``torch.compile`` wrapper included (the
    Accelerate compatibility layer keeps that one)."""
    from torch.nn.parallel import DataParallel, DistributedDataParallel

    if isinstance(obj, DistributedDataParallel):
        return "DistributedDataParallel", obj.module
    if isinstance(obj, DataParallel):
        return "DataParallel", obj.module
    if is_deepspeed_engine(obj):
        return "DeepSpeed engine", obj.module
    if "torch.distributed.fsdp" in sys.modules:
        from torch.distributed.fsdp import FullyShardedDataParallel

        if isinstance(obj, FullyShardedDataParallel):
            return "FSDP (FullyShardedDataParallel)", obj.module
    return None


def wrapper_layers(obj: Any) -> list[str]:
    """The wrappers around the plain module, outermost first (``[]`` for a plain module)."""
    layers = []
    while (layer := _inner(obj)) is not None:
        layers.append(layer[0])
        obj = layer[1]
    return layers


def peel(obj: Any, layer_of: Callable[[Any], tuple[str, Any] | None] = _inner) -> Any:
    """``obj`` with every wrapper layer that ``layer_of`` finds taken off (default: containers
    and ``torch.compile`` wrappers; :func:`container_layer`: containers only)."""
    while (layer := layer_of(obj)) is not None:
        obj = layer[1]
    return obj


def check_not_wrapped(model: Any, strategy: str = "") -> None:
    """Raise :class:`DistributedError` when ``model`` is already wrapped: a DDP/DataParallel/
    FSDP module, a DeepSpeed engine, an FSDP2-sharded module, or a plain module that a live
    wrapper returned by an earlier ``torchkiln.compile`` still holds."""
    wanted = f" for strategy {strategy!r}" if strategy else ""
    layers = wrapper_layers(model)
    if layers:
        raise DistributedError(
            f"the model given{wanted} is already wrapped by {layers[0]}; pass the plain module "
            "(torchkiln.unwrap(model)) and let torchkiln's distributed strategy wrap it once"
        )
    if is_fsdp2(model):
        raise DistributedError(
            f"the model given{wanted} is already sharded by FSDP2 (fully_shard); sharding it "
            "again would manage its parameters twice. Build a fresh model, or pass an unsharded one"
        )
    ref = getattr(model, "__dict__", {}).get(WRAPPED_BY_ATTR)
    holder = ref() if ref is not None else None
    if holder is not None:
        raise DistributedError(
            f"the model given{wanted} is still held by the {type(holder).__name__} that an earlier "
            "torchkiln.compile returned; wrapping it again would, for DDP, all-reduce every "
            "gradient twice. Keep using that wrapper, or drop it and build a fresh model"
        )


def strategy_owner(plugin: str | None, strategy: str) -> str:
    """``plugin 'acme' (strategy 'odd')``: faults are the plugin's, named with what it serves."""
    return f"plugin {plugin!r} (strategy {strategy!r})" if plugin else f"strategy {strategy!r}"


def check_result(result: _DistributedResult, model: nn.Module, plugin: str | None = None) -> None:
    """Raise :class:`DistributedError` when a strategy returned something inconsistent: its
    ``module`` is not the model it was given, or the model ended up wrapped twice. The message
    names ``plugin`` (the one that declared the strategy) when given."""
    who = strategy_owner(plugin, result.strategy)
    if result.module is not model:
        raise DistributedError(
            f"{who} returned module {type(result.module).__name__} instead "
            "of the model it was given; DistributedResult.module must be that plain model"
        )
    layers = wrapper_layers(result.wrapped)
    if len(layers) > 1:
        raise DistributedError(
            f"{who} wrapped the model twice: {' -> '.join(layers)}; a "
            "strategy must wrap the plain model exactly once"
        )
    if layers and unwrap(result.wrapped) is not model:
        raise DistributedError(
            f"{who} returned a {layers[0]} that does not hold the model it was given"
        )


def attach(result: _DistributedResult) -> None:
    """Remember ``result`` on the wrapper (for :func:`distributed_result`) and mark the plain
    module as held by it (for :func:`check_not_wrapped`)."""
    if result.wrapped is result.module:
        return
    if hasattr(result.wrapped, "__dict__"):
        object.__setattr__(result.wrapped, RESULT_ATTR, result)
    # A wrapper that cannot be weakly referenced is simply not remembered.
    with contextlib.suppress(TypeError):
        result.module.__dict__[WRAPPED_BY_ATTR] = weakref.ref(result.wrapped)


def distributed_result(obj: Any) -> _DistributedResult | None:
    """The :class:`DistributedResult` behind what ``torchkiln.compile`` returned (``extras``
    holds DeepSpeed's ``optimizer``, ``lr_scheduler`` and ``training_dataloader``), or
    ``None`` for a model compiled without a wrapper."""
    return getattr(obj, "__dict__", {}).get(RESULT_ATTR)


# --- getting the plain module and its state back -----------------------------------------------


def unwrap(obj: Any) -> nn.Module:
    """The plain user module behind ``obj``.

    ``DistributedDataParallel.module``, ``DeepSpeedEngine.module``, ``OptimizedModule._orig_mod``
    (peeled repeatedly), the module a third-party strategy reported, or ``obj`` itself (an
    FSDP2-sharded model *is* the user's module).
    """
    result = distributed_result(obj)
    if result is not None:
        return result.module
    obj = peel(obj)
    if not isinstance(obj, nn.Module):
        raise TypeError(f"torchkiln.unwrap expects a module or a wrapper, got {type(obj).__name__}")
    return obj


def _snapshot(state: Mapping[str, Any]) -> dict[str, Any]:
    return {
        dynamo.without_wrapper_keys(key): value.detach().to("cpu", copy=True)
        if isinstance(value, torch.Tensor)
        else value
        for key, value in state.items()
    }


def full_state_dict(obj: Any, *, rank0_only: bool = True) -> dict[str, Any]:
    """The full, unsharded state dict of the plain module behind ``obj``, on the CPU.

    Keys are the plain module's own (no ``module.`` or ``_orig_mod.``): the dict loads with
    ``load_state_dict(strict=True)`` into the same model built without torchkiln or any engine.
    FSDP2 shards are gathered and DeepSpeed ZeRO-3 partitions consolidated, so **call it on
    every rank** (it is a collective). With ``rank0_only`` (the default) ranks other than 0
    get ``{}``, which keeps memory down and makes ``if rank == 0: torch.save(...)`` natural.

    :param obj: what ``torchkiln.compile`` returned, or the plain module.
    :param rank0_only: return the dict on rank 0 only.
    """
    result = distributed_result(obj)
    custom = result.full_state_dict if result is not None else None
    state = custom() if custom is not None else _gather(unwrap(obj), rank0_only)
    if rank0_only and process_group_ready() and torch.distributed.get_rank() != 0:
        return {}
    return _snapshot(state)


def _gather(module: nn.Module, rank0_only: bool) -> Mapping[str, Any]:
    if is_fsdp2(module):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=rank0_only)
        return get_model_state_dict(module, options=options)
    if any(hasattr(p, "ds_id") for p in module.parameters()):  # DeepSpeed ZeRO-3 partitioned
        import deepspeed

        # Every rank takes part in the gather; the copies must be taken inside the context,
        # which re-partitions the parameters when it exits.
        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
            return _snapshot(module.state_dict())
    return module.state_dict()


# --- options passed through to an engine ------------------------------------------------------


def check_options(
    strategy: str,
    entry_point: str,
    accepted: Callable[..., Any],
    options: Mapping[str, Any],
    reserved: tuple[str, ...] = (),
) -> dict[str, Any]:
    """``options`` (``distributed.options``) as keyword arguments of ``accepted``; raise
    :class:`DistributedError` naming the bad keys and the allowed ones."""
    parameters = inspect.signature(accepted).parameters
    allowed = sorted(
        name
        for name, p in parameters.items()
        if name not in ("self", *reserved) and p.kind is not inspect.Parameter.VAR_KEYWORD
    )
    bad = sorted(set(options) - set(allowed))
    if bad:
        raise DistributedError(
            f"distributed.options for strategy {strategy!r} are passed to {entry_point}, which "
            f"does not accept {', '.join(map(repr, bad))}; allowed: {', '.join(allowed)}"
        )
    return dict(options)


# v1: ``from torchkiln.distributed import DistributedResult`` (now in torchkiln.plugin).
__getattr__ = v1_names(__name__)
