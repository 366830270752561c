"""One rank of ``torchkiln bench --ranks N`` (started by ``torchrun``; :mod:`torchkiln.bench.jobs`).

``python -m torchkiln.bench.job_rank OUT_DIR SETTINGS_JSON``: builds the bench model, compiles
it with torchkiln (DDP, the settings' ``job`` section), runs ``steps`` training steps and writes
``OUT_DIR/rank<N>.json``: when its first step ended (wall clock, to compare with the launch), the
first step's seconds and CPU seconds (inductor's compile workers included), the later steps,
the graphs Dynamo compiled here, and the report's ``job`` lines.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from torchkiln.bench.results import write_result


def cpu_seconds() -> float:
    """This process's CPU seconds and its finished children's (inductor's compile workers)."""
    own, children = (
        resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def measure(out_dir: Path, settings: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    import torchkiln
    from torchkiln._internals import dynamo
    from torchkiln.examples import example_inputs, load_model

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = load_model(settings["model"], depth=settings["depth"]).train()
    inputs = example_inputs(model, settings["batch"], settings["seq"])
    model = torchkiln.compile(
        model,
        backend=settings["backend"],
        distributed="ddp" if world > 1 else "none",
        cache_dir=str(out_dir / f"inductor-cache-{rank}"),
        job=settings["job"],
        tiered={"enabled": settings.get("tiered", False), "when": "always", "max_slowdown": 0},
        progress="off",
    )
    steps = []
    switched_at = None
    for step in range(settings["steps"]):
        cpu, started = cpu_seconds(), time.perf_counter()
        model.zero_grad(set_to_none=True)
        output = model(inputs)
        output.logits.float().mean().backward()
        steps.append(time.perf_counter() - started)
        if step == 0:
            first_cpu, first_done = cpu_seconds() - cpu, time.time()
        tiers = torchkiln.report(model).tiers
        if tiers is not None and tiers.switched_at_call is not None:
            switched_at = tiers.switched_at_call  # the same call on every rank: all stop here
            break
    report = torchkiln.report(model)
    return {
        "rank": rank,
        "world": world,
        "first_step_done": first_done,
        "first_step_s": steps[0],
        "first_step_cpu_s": first_cpu,
        "later_step_s": statistics.median(steps[1:]) if len(steps) > 1 else None,
        "dynamo_graphs": int(dynamo.counters()["stats"]["unique_graphs"]),
        "job": report.job.lines() if report.job is not None else None,
        "steps": len(steps),
        "switched_at_step": switched_at,
        "builder_processes": report.tiers.builder_processes if report.tiers is not None else 0,
    }


def main(argv: list[str] | None = None) -> int:
    import torch.distributed as dist

    out_dir, settings = Path((argv or sys.argv)[1]), json.loads((argv or sys.argv)[2])
    dist.init_process_group("gloo")
    result = measure(out_dir, settings)
    write_result(out_dir / f"rank{result['rank']}.json", result)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
