"""One rank of a 2-process distributed check, run by ``torchrun`` from the tests.

``python -m torch.distributed.run --nproc_per_node=2 worker.py STRATEGY OUT_DIR [ZERO_STAGE]``

Each rank trains the same small Llama twice from the same seeds, a few optimizer steps each:
once wrapped by hand with the engine's own API (the reference) and once through
``torchkiln.compile(..., backend="aot_eager", distributed=STRATEGY)``. It measures, and writes
to ``OUT_DIR/rank<N>.json``; the pytest files assert on those numbers. Several checks share a
run because each process start costs seconds on two cores.
"""

from __future__ import annotations

import gc
import json
import math
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import torchkiln
from torchkiln.distributed import check_result, full_state_dict, unwrap
from torchkiln.examples import llama
from torchkiln.plugin import DistributedResult

STEPS = 3
LR = 1e-2
BATCH, SEQ = 2, 16
MODEL_SHAPE = {
    "depth": 2,
    "hidden_size": 64,
    "heads": 4,
    "kv_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 256,
}


def build() -> nn.Module:
    return llama(**MODEL_SHAPE)


def rank() -> int:
    return dist.get_rank()


def batches() -> list[torch.Tensor]:
    """Different data on each rank (so gradients must be all-reduced), the same in every run."""
    generator = torch.Generator().manual_seed(100 + rank())
    return [
        torch.randint(0, MODEL_SHAPE["vocab_size"], (BATCH, SEQ), generator=generator)
        for _ in range(STEPS)
    ]


def mean_over_ranks(value: torch.Tensor) -> float:
    value = value.detach().float().clone()
    dist.all_reduce(value)
    return value.item() / dist.get_world_size()


def train_torch(
    forward: Callable[[torch.Tensor], torch.Tensor], optimizer: torch.optim.Optimizer
) -> list[float]:
    losses = []
    for ids in batches():
        loss = forward(ids)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(mean_over_ranks(loss))
    return losses


def train_engine(engine: Any) -> list[float]:
    losses = []
    for ids in batches():
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        losses.append(mean_over_ranks(loss))
    return losses


def loss_of(model: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda ids: model(input_ids=ids, labels=ids).loss


def compiled_graphs() -> int:
    """Graphs a backend compiled in this process: torch's AOTAutograd counter (``aot_eager`` and
    ``inductor`` both lower through it). Dynamo's graph counter also counts the graph a rank of
    a job traces, without compiling it, for the rank-invariance check."""
    return int(torch._dynamo.utils.counters["aot_autograd"]["total"])


def region_summary(model: Any) -> list[dict[str, Any]]:
    report = torchkiln.report(model)
    return [
        {
            "path": r.path,
            "status": r.status,
            "graphs": r.graphs,
            "reused": r.reused,
            "graph_breaks": r.graph_break_count,
            "fallback_reason": r.fallback_reason,
        }
        for r in report.regions
    ]


def state_dict_checks(
    state: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]
) -> dict[str, Any]:
    """On rank 0: the gathered dict against a fresh plain model and against the reference."""
    if rank() != 0:
        return {"size": len(state)}
    fresh = build()
    plain_keys = sorted(fresh.state_dict())
    load_error = None
    try:
        fresh.load_state_dict(state, strict=True)
    except Exception as error:  # reported, asserted on by the test
        load_error = f"{type(error).__name__}: {error}"
    reloaded = fresh.state_dict()
    return {
        "size": len(state),
        "keys_match": sorted(state) == plain_keys,
        "extra_keys": sorted(set(state) - set(plain_keys))[:5],
        "missing_keys": sorted(set(plain_keys) - set(state))[:5],
        "load_error": load_error,
        "max_diff_vs_reference": max_diff(state, reference),
        "reloaded_equal": all(
            torch.equal(reloaded[k], state[k].to(reloaded[k].dtype)) for k in state
        ),
    }


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    if set(a) != set(b):
        return math.inf
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def error_text(action: Callable[[], Any]) -> dict[str, str] | None:
    try:
        action()
    except Exception as error:
        return {"type": type(error).__name__, "message": str(error)}
    return None


def params_checksum(module: nn.Module) -> float:
    return float(sum(p.detach().float().sum().item() for p in module.parameters()))


# --- DDP --------------------------------------------------------------------------------------


def run_ddp() -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel

    out: dict[str, Any] = {}
    reference = DistributedDataParallel(build())
    out["reference_losses"] = train_torch(
        loss_of(reference), torch.optim.AdamW(reference.parameters(), lr=LR)
    )
    reference_state = {k: v.detach().clone() for k, v in reference.module.state_dict().items()}

    model = build()
    graphs_before = compiled_graphs()
    wrapped = torchkiln.compile(
        model,
        backend="aot_eager",
        distributed={"strategy": "ddp", "ddp": {"bucket_cap_mb": 1, "broadcast_buffers": False}},
    )
    out["returned"] = type(wrapped).__name__
    out["bucket_bytes_cap"] = wrapped.bucket_bytes_cap
    out["broadcast_buffers"] = wrapped.broadcast_buffers
    out["unwrap_is_model"] = unwrap(wrapped) is model
    out["losses"] = train_torch(loss_of(wrapped), torch.optim.AdamW(wrapped.parameters(), lr=LR))
    out["new_compiled_graphs"] = compiled_graphs() - graphs_before
    out["regions"] = region_summary(wrapped)
    job = torchkiln.report(wrapped).job
    out["job_roles"] = [(g.role, g.source) for g in job.groups] if job is not None else None
    out["params_checksum"] = params_checksum(model)
    out["state_dict"] = state_dict_checks(full_state_dict(wrapped), reference_state)
    out["state_dict_all_ranks_size"] = len(full_state_dict(wrapped, rank0_only=False))

    # Wrapping twice, three ways.
    out["wrap_ddp_again"] = error_text(
        lambda: torchkiln.compile(wrapped, backend="aot_eager", distributed="ddp")
    )
    out["wrap_held_module_again"] = error_text(
        lambda: torchkiln.compile(model, backend="aot_eager", distributed="ddp")
    )
    double = DistributedResult(
        wrapped=DistributedDataParallel(DistributedDataParallel(build())),
        module=build(),
        strategy="double",
    )
    out["check_result_double"] = error_text(lambda: check_result(double, double.module))
    out["plugin_wraps_twice"] = error_text(
        lambda: torchkiln.compile(
            build(), backend="aot_eager", distributed="double", plugins=double_wrapping_plugins()
        )
    )
    out["bad_option"] = error_text(
        lambda: torchkiln.compile(
            build(),
            backend="aot_eager",
            distributed={"strategy": "ddp", "options": {"bucket_size": 3}},
        )
    )
    return out


def run_tiered_ddp() -> dict[str, Any]:
    """Tiered under DDP: rank 0's builder process builds for the job, both ranks switch at the
    same call; the loss curve must equal plain DDP's."""
    from torch.nn.parallel import DistributedDataParallel

    import torchkiln.tiered

    data = batches() * 2
    reference = DistributedDataParallel(build())
    optimizer = torch.optim.AdamW(reference.parameters(), lr=LR)
    out: dict[str, Any] = {"reference_losses": []}
    for ids in data:
        loss = loss_of(reference)(ids)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        out["reference_losses"].append(mean_over_ranks(loss))
    model = build()
    # two ranks on two cores leave none free: auto would not build (docs/tiered.md)
    tiered = {"enabled": True, "when": "always"}
    wrapped = torchkiln.compile(model, backend="aot_eager", distributed="ddp", tiered=tiered)
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=LR)
    out["losses"], out["serving"] = [], []
    for step, ids in enumerate(data):
        if step == len(data) // 2:
            out["built"] = torchkiln.tiered.wait(wrapped, 900)
        loss = loss_of(wrapped)(ids)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        out["losses"].append(mean_over_ranks(loss))
        out["serving"].append(torchkiln.tiered.tiers(wrapped).serving)
    tiers = torchkiln.tiered.tiers(wrapped)
    out["calls"], out["reason"] = tiers.calls, tiers.reason
    out["builder_processes"] = tiers.builder_processes
    out["switched_at_call"] = tiers.switched_at_call
    runtime = torchkiln.report(wrapped)  # the job's sharing: rank 0 builds for both ranks
    out["job"] = runtime.job.lines() if runtime.job is not None else None
    out["params_checksum"] = params_checksum(model)
    out["reference_checksum"] = params_checksum(reference.module)
    torchkiln.decompile(wrapped)
    return out


def double_wrapping_plugins() -> torchkiln.PluginManager:
    """A plugin manager with a faulty third-party strategy that wraps the model in DDP twice."""
    from torch.nn.parallel import DistributedDataParallel

    from torchkiln.plugin import DistributedSpec

    class DoubleWrap:
        @torchkiln.hookimpl
        def declare_distributed(self) -> list[DistributedSpec]:
            return [DistributedSpec("double", "wraps twice (a faulty plugin)")]

        @torchkiln.hookimpl
        def wrap_distributed(self, model, strategy, compile_regions):  # type: ignore[no-untyped-def]
            if strategy != "double":
                return None
            compile_regions(model)
            wrapped = DistributedDataParallel(DistributedDataParallel(model))
            return DistributedResult(wrapped=wrapped, module=model, strategy="double")

    pm = torchkiln.PluginManager(entry_points=False)
    pm.register(DoubleWrap(), name="double-wrap")
    return pm


# --- FSDP2 ------------------------------------------------------------------------------------


def fsdp2_reference(
    mesh: Any = None,
    optimizer: type[torch.optim.Optimizer] = torch.optim.AdamW,
    **shard_kwargs: Any,
) -> tuple[list[float], dict[str, torch.Tensor]]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = build()
    mesh = mesh or init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, **shard_kwargs)
    fully_shard(model, mesh=mesh, **shard_kwargs)
    losses = train_torch(loss_of(model), optimizer(model.parameters(), lr=LR))
    state = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    return losses, state


def watch_fsdp_hooks(model: nn.Module) -> dict[str, list[bool]]:
    """Hooks registered after ``fully_shard``'s run after its own: is each block's parameter
    set unsharded (plain tensors) when its forward starts and resharded (DTensors) after?"""
    from torch.distributed.tensor import DTensor

    seen: dict[str, list[bool]] = {
        "unsharded_in_forward": [],
        "resharded_after": [],
        "forward_calls": [],
    }
    for layer in model.model.layers:
        layer.register_forward_pre_hook(
            lambda m, args: seen["unsharded_in_forward"].append(
                not any(isinstance(p, DTensor) for p in m.parameters())
            )
        )
        layer.register_forward_hook(
            lambda m, args, output: seen["resharded_after"].append(
                all(isinstance(p, DTensor) for p in m.parameters())
            )
        )
    return seen


def compile_fsdp2(model: nn.Module, **section: Any) -> nn.Module:
    """``torchkiln.compile`` with the fsdp2 strategy and ``section`` as ``distributed.fsdp2``."""
    return torchkiln.compile(
        model, backend="aot_eager", distributed={"strategy": "fsdp2", "fsdp2": section}
    )


def run_fsdp2() -> dict[str, Any]:
    import torch._dynamo.config as dynamo_config
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy

    out: dict[str, Any] = {}
    out["reference_losses"], reference_state = fsdp2_reference()

    model = build()
    flags_before = dynamo_config.capture_scalar_outputs
    graphs_before = compiled_graphs()
    wrapped = torchkiln.compile(model, backend="aot_eager", distributed="fsdp2")
    out["returned_is_model"] = wrapped is model
    out["sharded_layers"] = [isinstance(layer, FSDPModule) for layer in model.model.layers]
    out["mesh_device"] = (
        model.model.layers[0]._get_fsdp_state()._fsdp_param_group.mesh_info.mesh.device_type
    )
    hooks = watch_fsdp_hooks(model)
    out["losses"] = train_torch(loss_of(wrapped), torch.optim.AdamW(model.parameters(), lr=LR))
    out["hooks"] = {k: [all(v), len(v)] for k, v in hooks.items() if v}
    out["new_compiled_graphs"] = compiled_graphs() - graphs_before
    out["regions"] = region_summary(wrapped)
    out["flags_untouched"] = dynamo_config.capture_scalar_outputs == flags_before
    out["state_dict"] = state_dict_checks(full_state_dict(wrapped), reference_state)
    out["state_dict_all_ranks_size"] = len(full_state_dict(wrapped, rank0_only=False))
    out["wrap_sharded_again"] = error_text(
        lambda: torchkiln.compile(wrapped, backend="aot_eager", distributed="fsdp2")
    )

    # Activation checkpointing + the Dynamo flags, restored by decompile.
    model = build()
    wrapped = compile_fsdp2(model, activation_checkpointing=True, dynamo_flags=True)
    out["ac_flags_on"] = bool(dynamo_config.capture_scalar_outputs)
    out["ac_losses"] = train_torch(loss_of(wrapped), torch.optim.AdamW(model.parameters(), lr=LR))
    out["ac_saved"] = saved_tensor_count(loss_of(wrapped), batches()[0])
    out["plain_saved"] = saved_tensor_count(loss_of(build()), batches()[0])
    out["ac_regions"] = region_summary(wrapped)
    out["ac_state_dict"] = state_dict_checks(full_state_dict(wrapped), reference_state)
    torchkiln.decompile(wrapped)
    out["ac_flags_restored"] = dynamo_config.capture_scalar_outputs == flags_before

    # Mixed precision named in the configuration, against fully_shard given the same policy.
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    out["mp_reference_losses"], mp_reference_state = fsdp2_reference(mp_policy=policy)
    model = build()
    wrapped = compile_fsdp2(
        model, mixed_precision={"param_dtype": "bfloat16", "reduce_dtype": "float32"}
    )
    applied = model.model.layers[0]._get_fsdp_state()._mp_policy
    # Field by field, not the repr: torch 2.15's policy has one more field than 2.11's.
    fields = ("param_dtype", "reduce_dtype", "output_dtype", "cast_forward_inputs")
    out["mp_policy"] = {name: str(getattr(applied, name)) for name in fields}
    out["mp_losses"] = train_torch(loss_of(wrapped), torch.optim.AdamW(model.parameters(), lr=LR))
    with torch.no_grad():
        out["mp_logits_dtype"] = str(wrapped(input_ids=batches()[0]).logits.dtype)
    out["mp_sharded_dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
    out["mp_regions"] = region_summary(wrapped)
    out["mp_state_dict"] = state_dict_checks(full_state_dict(wrapped), mp_reference_state)

    # HSDP from the configuration: 2 replicas of 1 shard, against fully_shard on the same mesh.
    hsdp_mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("replicate", "shard"))
    out["hsdp_reference_losses"], hsdp_reference_state = fsdp2_reference(mesh=hsdp_mesh)
    model = build()
    wrapped = compile_fsdp2(model, replicate_degree=2)
    mesh = model.model.layers[0]._get_fsdp_state()._fsdp_param_group.mesh_info.mesh
    out["hsdp_mesh"] = [list(mesh.shape), list(mesh.mesh_dim_names or ())]
    out["hsdp_losses"] = train_torch(loss_of(wrapped), torch.optim.AdamW(model.parameters(), lr=LR))
    out["hsdp_regions"] = region_summary(wrapped)
    out["hsdp_state_dict"] = state_dict_checks(full_state_dict(wrapped), hsdp_reference_state)
    out["hsdp_bad_degree"] = error_text(lambda: compile_fsdp2(build(), replicate_degree=3))
    return out


def saved_tensor_count(forward: Callable[[torch.Tensor], torch.Tensor], ids: torch.Tensor) -> int:
    """How many tensors autograd keeps for the backward of one forward: the witness that
    activation checkpointing happened (a checkpointed block keeps its inputs only)."""
    count = [0]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        count[0] += 1
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        forward(ids).backward()
    return count[0]


def run_fsdp2_checkpointing_inductor() -> dict[str, Any]:
    """FSDP2 + activation checkpointing with the default backend, inductor: trained against
    the same FSDP2 training without compile, then evaluated on another shape. SGD, not AdamW:
    inductor's kernels round differently from eager's (about 1e-7), and Adam turns a gradient
    near zero into a full-size step either way; SGD keeps the difference that small."""
    out: dict[str, Any] = {}
    out["reference_losses"], reference_state = fsdp2_reference(optimizer=torch.optim.SGD)
    evaluation = torch.randint(0, MODEL_SHAPE["vocab_size"], (1, 9), generator=torch.Generator())
    out["reference_saved"] = saved_tensor_count(loss_of(build()), batches()[0])

    model = build()
    wrapped = torchkiln.compile(
        model, distributed={"strategy": "fsdp2", "fsdp2": {"activation_checkpointing": True}}
    )
    out["backend"] = torchkiln.report(wrapped).backend
    out["losses"] = train_torch(loss_of(wrapped), torch.optim.SGD(model.parameters(), lr=LR))
    out["state_dict"] = state_dict_checks(full_state_dict(wrapped), reference_state)
    out["saved"] = saved_tensor_count(loss_of(wrapped), batches()[0])
    with torch.no_grad():  # evaluation: another shape, no grad (no checkpoint needed)
        got = wrapped(input_ids=evaluation).logits
    plain = build()
    plain.load_state_dict(full_state_dict(wrapped, rank0_only=False))
    with torch.no_grad():
        want = plain(input_ids=evaluation).logits
    out["eval_max_diff"] = (got - want).abs().max().item()
    out["regions"] = region_summary(wrapped)
    out["notes"] = torchkiln.report(wrapped).notes
    return out


# --- DeepSpeed --------------------------------------------------------------------------------


def deepspeed_config(stage: int) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": BATCH,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1000,
    }


def config_optimizer(stage: int) -> dict[str, Any]:
    """DeepSpeed's own optimizer section; torch_adam avoids JIT-building a fused Adam."""
    return deepspeed_config(stage) | {
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "torch_adam": True}}
    }


def gathered_reference(engine: Any) -> dict[str, torch.Tensor]:
    import deepspeed

    module = engine.module
    with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
        return {k: v.detach().clone() for k, v in module.state_dict().items()}


def run_deepspeed(stage: int, out_dir: Path) -> dict[str, Any]:
    import deepspeed

    out: dict[str, Any] = {"stage": stage}
    # Stage 0 passes a torch optimizer factory through distributed.options; stage 3 uses
    # DeepSpeed's optimizer section, from a JSON file (the other way users configure it).
    if stage == 3:
        ds_config: dict[str, Any] | str = str(out_dir / "ds_config.json")
        if rank() == 0:
            Path(ds_config).write_text(json.dumps(config_optimizer(stage)))
        dist.barrier()
        options: dict[str, Any] = {}
        reference_kwargs: dict[str, Any] = {"config": config_optimizer(stage)}
    else:
        ds_config = deepspeed_config(stage)

        def factory(params: Any) -> torch.optim.Optimizer:
            return torch.optim.AdamW(params, lr=LR)

        options = {"optimizer": factory}
        reference_kwargs = {"config": deepspeed_config(stage), "optimizer": factory}

    reference = build()
    engine, *_ = deepspeed.initialize(
        model=reference, model_parameters=[p for p in reference.parameters()], **reference_kwargs
    )
    out["reference_losses"] = train_engine(engine)
    reference_state = gathered_reference(engine)

    model = build()
    graphs_before = compiled_graphs()
    wrapped = torchkiln.compile(
        model,
        backend="aot_eager",
        distributed={
            "strategy": "deepspeed",
            "deepspeed": {"config": ds_config},
            "options": options,
        },
    )
    out["returned"] = type(wrapped).__name__
    out["engine_module_is_model"] = wrapped.module is model
    out["zero_stage"] = wrapped.zero_optimization_stage()
    result = torchkiln.distributed.distributed_result(wrapped)
    out["extras"] = {k: type(v).__name__ for k, v in (result.extras if result else {}).items()}
    out["engine_optimizer"] = type(wrapped.optimizer).__name__
    out["unwrap_is_model"] = unwrap(wrapped) is model
    out["losses"] = train_engine(wrapped)
    out["new_compiled_graphs"] = compiled_graphs() - graphs_before
    out["regions"] = region_summary(wrapped)
    job = torchkiln.report(wrapped).job
    out["job"] = [(g.role, g.source, g.reason) for g in job.groups] if job is not None else None
    out["state_dict"] = state_dict_checks(full_state_dict(wrapped), reference_state)
    out["state_dict_all_ranks_size"] = len(full_state_dict(wrapped, rank0_only=False))
    out["wrap_engine_again"] = error_text(
        lambda: torchkiln.compile(
            wrapped,
            backend="aot_eager",
            distributed={"strategy": "deepspeed", "deepspeed": {"config": ds_config}},
        )
    )
    return out


def main() -> None:
    strategy, out_dir = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    try:
        if strategy == "ddp":
            out = run_ddp()
        elif strategy == "tiered-ddp":
            out = run_tiered_ddp()
        elif strategy == "fsdp2":
            out = run_fsdp2()
        elif strategy == "fsdp2-checkpointing-inductor":
            out = run_fsdp2_checkpointing_inductor()
        elif strategy == "deepspeed":
            out = run_deepspeed(int(sys.argv[3]), out_dir)
        else:
            raise SystemExit(f"unknown strategy {strategy!r}")
    except Exception:
        out = {"error": traceback.format_exc()}
    out["world_size"] = dist.get_world_size()
    (out_dir / f"rank{rank()}.json").write_text(json.dumps(out, indent=1))
    # Models sit in reference cycles; free them (and the process group they hold) now, not
    # during interpreter shutdown.
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    main()
