"""Train a small Llama with torchkiln under DDP, FSDP2 or DeepSpeed: one script, any launcher.

The distributed strategy and everything else come from torchkiln's configuration, so the same
script runs unchanged under each engine::

    # one machine, 2 processes; the strategy from the environment, or from a YAML file
    TORCHKILN_DISTRIBUTED_STRATEGY=ddp torchrun --nproc_per_node=2 examples/distributed_train.py
    TORCHKILN_CONFIG=train.yaml torchrun --nproc_per_node=2 examples/distributed_train.py

    # two machines (run on each; node_rank 0 and 1)
    torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 --rdzv_backend=c10d \\
        --rdzv_endpoint=host0:29500 examples/distributed_train.py --config train.yaml

    # the DeepSpeed launcher (a hostfile for several machines)
    deepspeed --num_gpus=2 examples/distributed_train.py --config ds.yaml

See docs/distributed.md. ``--json`` writes each rank's summary (the tests read it).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import torchkiln
from torchkiln.distributed import is_deepspeed_engine
from torchkiln.examples import llama


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config", help="torchkiln YAML (default: $TORCHKILN_CONFIG or ./torchkiln.yaml)"
    )
    parser.add_argument("--strategy", help="override distributed.strategy (ddp, fsdp2, deepspeed)")
    parser.add_argument("--backend", help="override the compile backend (default from the config)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--save", type=Path, help="write the full state dict here (rank 0)")
    parser.add_argument("--json", type=Path, help="write this rank's summary to PATH/rank<N>.json")
    parser.add_argument(
        "--local_rank", type=int, default=None, help="set by the deepspeed launcher"
    )
    return parser.parse_args()


def setup() -> torch.device:
    """One process per device: NCCL on GPUs, gloo on CPU. torchrun and the deepspeed launcher
    both export RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, which this reads."""
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
        return device
    dist.init_process_group("gloo")
    return torch.device("cpu")


def train(wrapped: Any, steps: int, device: torch.device, vocab: int) -> list[float]:
    """The usual loop; a DeepSpeed engine owns its optimizer, the others get AdamW."""
    engine = is_deepspeed_engine(wrapped)
    optimizer = None if engine else torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(dist.get_rank())
    losses = []
    for _ in range(steps):
        ids = torch.randint(0, vocab, (2, 32), generator=generator).to(device)
        loss = wrapped(input_ids=ids, labels=ids).loss
        if engine:
            wrapped.backward(loss)
            wrapped.step()
        else:
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def run(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Build, compile, train and gather; every object holding the process group dies with this
    frame, so ``main`` can tear the group down with nothing of it left to finalise at exit."""
    model = llama(
        depth=args.depth, hidden_size=64, heads=4, kv_heads=2, intermediate_size=128, vocab_size=256
    ).to(device)
    overrides: dict[str, Any] = {}
    if args.strategy:
        overrides["distributed"] = args.strategy
    if args.backend:
        overrides["backend"] = args.backend
    wrapped = torchkiln.compile(model, args.config, **overrides)
    losses = train(wrapped, args.steps, device, vocab=256)

    report = torchkiln.report(wrapped)
    state = torchkiln.full_state_dict(wrapped)  # every rank calls it; rank 0 gets the dict
    if args.save and dist.get_rank() == 0:
        torch.save(state, args.save)
    return {
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "returned": type(wrapped).__name__,
        "plain_module": type(torchkiln.unwrap(wrapped)).__name__,
        "losses": losses,
        # running compiled code: compiled on this rank, or serving another rank's (a job)
        "regions_compiled": sum(r.status in ("compiled", "serving") for r in report.regions),
        "regions": len(report.regions),
        "backend": report.backend,
        "state_dict_keys": len(state),
        "job": report.job.lines() if report.job is not None else None,
    }


def main() -> None:
    args = parse_args()
    device = setup()
    summary = run(args, device)
    print(json.dumps(summary), flush=True)
    if args.json:
        args.json.mkdir(parents=True, exist_ok=True)  # docs/jobs.md's command names out/
        (args.json / f"rank{dist.get_rank()}.json").write_text(json.dumps(summary))
    # Modules with hooks sit in reference cycles; collect them (and the FSDP/DDP state that holds
    # the process group) now, while the interpreter is whole, rather than during its shutdown.
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
