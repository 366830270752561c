"""One rank of an unmodified Accelerate FSDP2 program with regional compilation, run by
``torchrun`` from ``test_jobs_accelerate_fsdp2.py``:

``python -m torch.distributed.run --nproc_per_node=2 accelerate_fsdp2_worker.py OUT_DIR SETTINGS_JSON``

SETTINGS_JSON: ``torchkiln`` (call ``torchkiln.compat.accelerate.install()`` first), ``backend``
(the dynamo plugin's), ``checkpointing`` and ``offload`` (the FSDP plugin's
``activation_checkpointing`` and ``activation_checkpointing_offload``), ``steps``. The job's
torchkiln settings come from ``TORCHKILN_*`` variables (``TORCHKILN_JOB_SHARE=off``).

:func:`program` is the user's code, as they would write it for GPUs. Two things around it are
the test's: each rank gets its own inductor cache (as separate machines would), and Accelerate
is told the run is FSDP: on the CPU it picks its multi-CPU (DDP) mode and ignores
``fsdp_plugin`` (``AcceleratorState`` sets ``DistributedType.FSDP`` for GPU-like devices
only). Each rank writes ``OUT_DIR/rank<N>.json`` (the report's job lines, the losses, torch's
cache counters) and ``OUT_DIR/params<N>.pt`` (its shards).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

RANK = int(os.environ.get("RANK", "0"))


def tiny_llama() -> Any:
    """``LlamaForCausalLM`` from its default config, only the sizes changed."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=256)  # fmt: skip
    return LlamaForCausalLM(config)


def program(settings: dict[str, Any]) -> tuple[Any, Any, list[float]]:
    """An Accelerate FSDP2 training loop with regional compilation (nothing torchkiln in it)."""
    import torch
    from accelerate import Accelerator
    from accelerate.utils import FullyShardedDataParallelPlugin, TorchDynamoPlugin

    fsdp_plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        auto_wrap_policy="transformer_based_wrap",  # each LlamaDecoderLayer its own FSDP unit
        activation_checkpointing=settings.get("checkpointing", False),
        activation_checkpointing_offload=settings.get("offload", False),
    )
    dynamo_plugin = TorchDynamoPlugin(
        backend=settings.get("backend", "inductor"), use_regional_compilation=True
    )
    accelerator = Accelerator(cpu=True, fsdp_plugin=fsdp_plugin, dynamo_plugin=dynamo_plugin)
    as_fsdp_on_the_cpu(accelerator, fsdp_plugin)
    model = tiny_llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    generator = torch.Generator().manual_seed(100 + accelerator.process_index)
    losses = []
    for _ in range(settings.get("steps", 2)):
        ids = torch.randint(0, 256, (2, 16), generator=generator)
        loss = model(input_ids=ids, labels=ids).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return accelerator, model, losses


def as_fsdp_on_the_cpu(accelerator: Any, fsdp_plugin: Any) -> None:
    """What ``AcceleratorState`` does on a GPU with an ``fsdp_plugin``."""
    from accelerate.utils import DistributedType

    accelerator.state.distributed_type = DistributedType.FSDP
    accelerator.state.fsdp_plugin = fsdp_plugin
    assert accelerator.is_fsdp2


def run(out_dir: Path, settings: dict[str, Any]) -> dict[str, Any]:
    import torch

    import torchkiln
    from torchkiln._internals import dynamo

    if settings.get("torchkiln", True):
        import torchkiln.compat.accelerate

        torchkiln.compat.accelerate.install()
    accelerator, model, losses = program(settings)
    from torch.distributed.fsdp import FSDPModule

    params = {n: p.to_local().detach() for n, p in model.named_parameters()}
    torch.save(params, out_dir / f"params{RANK}.pt")
    counters = dynamo.counters()
    result: dict[str, Any] = {
        "rank": RANK,
        "losses": losses,
        "dynamo_graphs": int(counters["stats"]["unique_graphs"]),
        "fsdp_blocks": sorted(
            type(m).__name__ for m in model.modules() if isinstance(m, FSDPModule)
        ),
        "cache_counters": {
            f"{kind}.{name}": int(value)
            for kind in ("inductor", "aot_autograd")
            for name, value in counters[kind].items()
            if "cache" in name
        },
        "job_lines": [],
        "regions": [],
    }
    if torchkiln.is_compiled(model):
        report = torchkiln.report(model)
        result["job_lines"] = report.job.lines() if report.job is not None else []
        result["regions"] = [[r.path, r.status, r.graphs, r.graph_breaks] for r in report.regions]
    accelerator.wait_for_everyone()
    return result


def main() -> None:
    out_dir, settings = Path(sys.argv[1]), json.loads(sys.argv[2])
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(out_dir / f"inductor-cache-{RANK}")
    try:
        result = run(out_dir, settings)
    except Exception as error:
        result = {"rank": RANK, "error": f"{type(error).__name__}: {error}",
                  "traceback": traceback.format_exc()}  # fmt: skip
    (out_dir / f"rank{RANK}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
