"""One compile per job under FSDP2, measured (issue 42; docs/jobs.md, "FSDP2: measured").

Launches, on this machine, for activation checkpointing off and on: one rank; two ranks each
compiling its own (``job.share: off``); two ranks sharing (rank 0 compiles, rank 1 loads its
saved function) with a fresh ``job.store``; the same two ranks again (the restart: every rank
loads from the store, fresh inductor caches). Each job trains the default-config example Llama
(``torchkiln.examples.llama(depth=...)``: hidden 256, 8 heads, 4 KV heads, MLP 688, vocabulary
4096) with FSDP2 over gloo on the CPU, backend inductor, one thread a rank, batch 1 of 128
tokens, SGD::

    python examples/fsdp2_job_bench.py --depth 16 --checkpointing both --json docs/data/fsdp2-job-depth16.json

Per rank: the first training step's wall time and CPU seconds (``time.process_time``, and the
same with inductor's compile workers from ``getrusage``), the report's ``job:`` lines, torch's
cache counters (inductor's FX-graph cache, AOTAutograd's cache) and the C++ compiles it ran.
The trained parameters of the shared job are compared with the job where each rank compiled.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

SEQUENCE = 128


def cpu_with_children() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def cache_counters() -> dict[str, int]:
    from torchkiln._internals import dynamo

    counters = dynamo.counters()
    found = {f"inductor.{k}": int(v) for k, v in counters["inductor"].items() if "cache" in k}
    found |= {
        f"aot_autograd.{k}": int(v) for k, v in counters["aot_autograd"].items() if "cache" in k
    }
    found["dynamo.unique_graphs"] = int(counters["stats"]["unique_graphs"])
    return found


def cpp_compiles() -> int:
    """C++ kernel builds this process ran (cache misses of inductor's C++ code cache)."""
    from torch._inductor import cpp_builder

    return int(getattr(cpp_builder, "_torchkiln_bench_builds", 0))


def count_cpp_builds() -> None:
    from torch._inductor import cpp_builder

    original = cpp_builder.CppBuilder.build

    def build(self: Any, *args: Any, **kwargs: Any) -> Any:
        cpp_builder._torchkiln_bench_builds = cpp_compiles() + 1  # type: ignore[attr-defined]
        return original(self, *args, **kwargs)

    cpp_builder.CppBuilder.build = build  # type: ignore[method-assign]


def rank_main(out: Path, settings: dict[str, Any]) -> None:
    import torch.distributed as dist

    import torchkiln
    from torchkiln.examples import llama

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    count_cpp_builds()
    torch.manual_seed(0)
    model = llama(depth=settings["depth"])
    job: dict[str, Any] = {"share": settings["share"], "timeout": 1800}
    if settings.get("store"):
        job["store"] = settings["store"]
    torchkiln.compile(
        model,
        backend="inductor",
        distributed={
            "strategy": "fsdp2",
            "fsdp2": {"activation_checkpointing": settings["checkpointing"]},
        },
        job=job,
        cache_dir=str(out / f"inductor-cache-{rank}"),
        progress="off",
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(100 + rank)
    steps, losses = [], []
    first: dict[str, float] = {}
    for step in range(settings["steps"]):
        ids = torch.randint(0, 4096, (1, SEQUENCE), generator=generator)
        wall, cpu, cpu_all = time.perf_counter(), time.process_time(), cpu_with_children()
        loss = model(ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        seconds = time.perf_counter() - wall
        if step == 0:
            first = {
                "first_step_s": seconds,
                "first_step_cpu_s": time.process_time() - cpu,
                "first_step_cpu_with_workers_s": cpu_with_children() - cpu_all,
            }
        steps.append(seconds)
        losses.append(loss.item())
    report = torchkiln.report(model)
    params = {name: p.detach().to_local().clone() for name, p in model.named_parameters()}
    torch.save(params, out / f"params{rank}.pt")
    result = {
        "rank": rank,
        **first,
        "later_step_median_s": statistics.median(steps[1:]) if len(steps) > 1 else None,
        "losses": losses,
        "job_lines": report.job.lines() if report.job is not None else [],
        "counters": cache_counters(),
        "cpp_compiles": cpp_compiles(),
    }
    (out / f"rank{rank}.json").write_text(json.dumps(result, indent=1))
    dist.destroy_process_group()


def launch(out: Path, ranks: int, settings: dict[str, Any]) -> dict[str, Any]:
    out.mkdir(parents=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}",
               __file__, "--rank-worker", str(out), json.dumps(settings)]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    cold_start = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{out.name} failed:\n{done.stderr[-4000:]}")
    found = [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]
    return {"ranks": ranks, "settings": settings, "cold_start_s": cold_start, "per_rank": found}


def max_param_diff(a: Path, b: Path, ranks: int) -> float:
    worst = 0.0
    for rank in range(ranks):
        one = torch.load(a / f"params{rank}.pt")
        two = torch.load(b / f"params{rank}.pt")
        for name, tensor in one.items():
            worst = max(worst, float((tensor - two[name]).abs().max()))
    return worst


def summary(name: str, run: dict[str, Any], one: dict[str, Any]) -> str:
    per = run["per_rank"]
    base = one["per_rank"][0]
    first = max(r["first_step_s"] for r in per)
    key = "first_step_cpu_with_workers_s"  # the C++ compiler's processes included
    cpu = sum(r[key] for r in per)
    steps = ", ".join(f"{r['first_step_s']:.1f}" for r in per)
    cpus = ", ".join(f"{r[key]:.1f}" for r in per)
    return (
        f"| {name} | {steps} s | {first / base['first_step_s']:.2f} "
        f"| {cpus} | {cpu / base[key]:.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write every job's numbers here")
    parser.add_argument("--checkpointing", choices=["off", "on", "both"], default="both")
    parser.add_argument("--rank-worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_worker:
        rank_main(Path(args.rank_worker[0]), json.loads(args.rank_worker[1]))
        return
    work = Path(tempfile.mkdtemp(prefix="fsdp2-job-bench-"))
    results: dict[str, Any] = {
        "torch": torch.__version__,
        "depth": args.depth,
        "steps": args.steps,
        "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d"),
        "jobs": {},
    }
    lines = []
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.checkpointing]
    for checkpointing in modes:
        tag = "ac" if checkpointing else "plain"
        base = {"depth": args.depth, "steps": args.steps, "checkpointing": checkpointing}
        store = str(work / f"{tag}-store")
        runs = {
            "1 rank": launch(work / f"{tag}-one", 1, {**base, "share": "auto"}),
            "2 ranks, each compiles": launch(work / f"{tag}-off", 2, {**base, "share": "off"}),
            "2 ranks, shared": launch(
                work / f"{tag}-shared", 2, {**base, "share": "auto", "store": store}
            ),
            "2 ranks, restart": launch(
                work / f"{tag}-restart", 2, {**base, "share": "auto", "store": store}
            ),
        }
        diff = max_param_diff(work / f"{tag}-off", work / f"{tag}-shared", 2)
        results["jobs"][tag] = {"runs": runs, "max_param_diff_shared_vs_each_compiles": diff}
        lines.append(f"activation checkpointing {'on' if checkpointing else 'off'}:")
        lines.append("| job | first step per rank | vs 1 rank | CPU-s per rank | sum vs 1 rank |")
        lines += [summary(name, run, runs["1 rank"]) for name, run in runs.items()]
        cold = max(r["first_step_s"] for r in runs["2 ranks, shared"]["per_rank"])
        again = max(r["first_step_s"] for r in runs["2 ranks, restart"]["per_rank"])
        lines.append(f"restart / cold first step: {again / cold:.2f}; max param diff {diff:.2e}")
        for name, run in runs.items():
            for r in run["per_rank"]:
                lines.append(f"  {name} rank {r['rank']}: {r['job_lines'][1:] or r['job_lines']}")
                lines.append(f"    counters {r['counters']} cpp {r['cpp_compiles']}")
    print("\n".join(lines))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
