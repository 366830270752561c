"""One bench measurement, in a process of its own: ``python -m torchkiln.bench.worker``.

Three kinds of run, each with the inductor cache directory the runner chose:

* ``--strategy NAME`` (first call): builds the model, applies one strategy and times applying
  it plus the first call, where compilation happens; Dynamo's counts after it and after
  ``--warmup`` more calls; ``max_abs_diff`` against the same model run eagerly afterwards.
* ``--strategies A,B,...`` (steady state): one model copy per strategy, each compiled and
  warmed up, then timed in alternating rounds (``steady_seconds`` per strategy).
* ``--precompile``: writes ``precompiled``'s artifact directory (untimed by the cell).

It writes one JSON record to ``--output``, and progress lines (:data:`PROGRESS_PREFIX` then
what it is doing, ``steady 7/10`` for counted work) to stderr, which the runner shows.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from torchkiln.bench.results import write_result
from torchkiln.bench.strategies import (
    TORCHKILN_STRATEGIES,
    Strategies,
    alternate_rounds,
    build,
    eager_reference,
    first_tensor,
    step,
    switched,
    synced,
    timed,
    until_whole_model,
)

START = time.perf_counter()
START_WALL = time.time()
PROGRESS_PREFIX = "torchkiln-bench-progress: "
"""Starts every progress line on stderr (the runner reads them)."""


def progress(text: str) -> None:
    """Tell the runner what this process is doing now (outside every timed call)."""
    print(PROGRESS_PREFIX + text, file=sys.stderr, flush=True)


def _counted(what: str, count: int, call: Callable[[], Any]) -> list[Any]:
    """``call()`` ``count`` times, saying ``what i/count`` after each."""
    results = []
    for index in range(count):
        results.append(call())
        progress(f"{what} {index + 1}/{count}")
    return results


RECORDED_ARGS = (
    "model", "depth", "batch", "seq", "backend", "device", "dtype", "mode", "train", "workload",
)  # fmt: skip
"""The command-line values every worker record starts with."""


def run_record(
    args: argparse.Namespace, started_wall: float, torch_import: float
) -> dict[str, Any]:
    """The fields every worker record starts with: what it ran, where and how."""
    import torch

    return {name: getattr(args, name) for name in RECORDED_ARGS} | {
        "startup_seconds": started_wall - args.spawned_at if args.spawned_at is not None else None,
        "torch_import_seconds": torch_import,
        "threads": torch.get_num_threads(),
        "cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
        "torch": torch.__version__,
        "load_average": list(os.getloadavg()),
    }


def dynamo_counts() -> dict[str, Any]:
    """Graphs, recompiles, graph breaks, cache hits and compile seconds Dynamo recorded."""
    from torchkiln._internals import dynamo

    counters = dynamo.counters()
    metrics = dynamo.compilation_metrics()
    inductor = counters["inductor"]
    aot = counters["aot_autograd"]
    reasons = [m.recompile_reason for m in metrics if getattr(m, "recompile_reason", None)]
    return {
        "graphs": int(counters["stats"]["unique_graphs"]),
        # Records without a frame (loading a precompiled inductor function) are not frames.
        "frames_compiled": sum(1 for m in metrics if getattr(m, "co_name", None)),
        "recompiles": len(reasons),
        "recompile_reasons": reasons,
        "graph_breaks": int(sum(counters["graph_break"].values())),
        "graph_break_reasons": dict(counters["graph_break"]),
        "dynamo_compile_seconds": round(
            sum(float(getattr(m, "entire_frame_compile_time_s", 0.0) or 0.0) for m in metrics), 6
        ),
        "fxgraph_cache_hits": int(inductor["fxgraph_cache_hit"]),
        "fxgraph_cache_misses": int(inductor["fxgraph_cache_miss"]),
        "aotautograd_cache_hits": int(aot["autograd_cache_hit"]),
        "aotautograd_cache_misses": int(aot["autograd_cache_miss"]),
        # reduce-overhead: graphs inductor ran without CUDA graphs (mutated inputs, CPU tensors,
        # dynamic shapes...); nonzero means the mode's numbers are partly the default mode's.
        "cudagraph_skips": int(inductor["cudagraph_skips"]),
    }


def report_summary(strategy: str, model: Any) -> dict[str, Any] | None:
    """The torchkiln report of a torchkiln strategy's model, in short (``None`` for others)."""
    if strategy not in TORCHKILN_STRATEGIES:
        return None
    import torchkiln

    report = torchkiln.report(model)
    return {
        "selector": report.selector,
        "reason": report.reason,
        "regions": len(report.regions),
        "total_graphs": report.total_graphs,
        "total_compile_seconds": report.total_compile_seconds,
        "statuses": sorted({r.status for r in report.regions}),
        "tiers": attrs.asdict(report.tiers) if report.tiers is not None else None,
    }


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m torchkiln.bench.worker")
    p.add_argument("--model", required=True)
    p.add_argument("--depth", type=int)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=128)
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--strategy", help="time one strategy's first call")
    group.add_argument("--strategies", help="comma-separated: time their steady state together")
    group.add_argument(
        "--precompile", action="store_true", help="write the artifact directory (--artifacts)"
    )
    p.add_argument("--artifacts", help="artifact directory of the precompiled strategy")
    p.add_argument(
        "--tiered-artifacts",
        help="the tiered strategy's artifact directory: its builder writes the whole-model form "
        "there in the first-call run, and the steady-state run loads it from there",
    )
    p.add_argument("--backend", default="inductor")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", help="the model's dtype (torch name)")
    p.add_argument("--mode", help="torch.compile mode of every compiled strategy")
    p.add_argument(
        "--steady-here",
        action="store_true",
        help="--strategy: also time --steady-iters calls after the warm-up (steady_seconds)",
    )
    p.add_argument("--train", action="store_true")
    p.add_argument("--workload", choices=("forward", "train", "generate"))
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--steady-iters", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--output", required=True)
    p.add_argument(
        "--spawned-at",
        type=float,
        help="time.time() when the runner started this process (to measure startup)",
    )
    args = p.parse_args(argv)
    if args.workload is None:
        args.workload = "train" if args.train else "forward"
    args.train = args.workload == "train"
    return args


def measure_first_call(args: argparse.Namespace) -> dict[str, Any]:
    """Apply one strategy and time the first call; then a few more calls to catch recompiles."""
    if args.workload == "generate":
        from torchkiln.bench.generate import first_token

        progress("first generate() (compiling)")
        result, target = first_token(args)
        after = dynamo_counts()  # the decode steps compile during the first call
        return result | {
            "phase": "first_call",
            "strategy": args.strategy,
            "first_call": after,
            "after_later_calls": after,
            "torchkiln_report": report_summary(args.strategy, target),
        }
    started = time.perf_counter()
    progress("building the model")
    model, inputs = build(args)
    built = time.perf_counter()
    call_target = None

    def first() -> Any:
        nonlocal call_target
        call_target = Strategies.of(args).apply(args.strategy, model)
        return step(call_target, model, inputs, args.train)()

    first_started = time.perf_counter()
    progress("first call (compiling)")
    first_seconds, output = timed(first, args.device)
    # A copy: under CUDA graphs (reduce-overhead) the next replay overwrites the output.
    first_out = first_tensor(output).detach().clone()
    counts_after_first = dynamo_counts()
    call = step(call_target, model, inputs, args.train)
    tiered = None
    if args.strategy == "tiered":
        progress("regional until the whole-model form replaces it")
        tiered = until_whole_model(
            synced(call, args.device), model, first_started, time.perf_counter
        )
    later = _counted("warm-up", args.warmup, lambda: timed(call, args.device)[0])
    steady_calls = args.steady_iters if args.steady_here else 0
    steady = _counted("steady", steady_calls, lambda: timed(call, args.device)[0])
    return {
        "phase": "first_call",
        "strategy": args.strategy,
        "first_call_seconds": first_seconds,
        "later_calls_seconds": later,
        "steady_seconds": steady or None,
        "output_dtype": str(first_out.dtype).removeprefix("torch."),
        "build_seconds": built - started,
        "first_call": counts_after_first,
        "after_later_calls": dynamo_counts(),
        "torchkiln_report": report_summary(args.strategy, model),
        "tiered": tiered,
        "max_abs_diff": eager_reference(args.strategy, model, inputs, first_out),
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def _steady_call(strategy: str, args: argparse.Namespace) -> Callable[[], float]:
    """One timed call of ``strategy``'s model: a step's seconds, or a generate's median seconds
    per decoded token."""
    model, inputs = build(args)
    strategies = Strategies.of(args)
    if args.workload == "generate":
        from torchkiln.bench.generate import steady_decode

        target = strategies.generation_target(strategy, model)
        call = steady_decode(target, inputs, args.new_tokens)
    else:
        call = step(strategies.apply(strategy, model), model, inputs, args.train)
    call = switched(call, model) if strategy == "tiered" else call
    return lambda: timed(call, args.device)[1 if args.workload == "generate" else 0]


def measure_steady(args: argparse.Namespace) -> dict[str, Any]:
    """Steady state of every strategy in one process, each on its own copy of the model (same
    seed, same weights), timed in alternating rounds of one call each (:func:`alternate_rounds`): all
    see the same machine load, so their ratios stay meaningful on a busy machine."""
    strategies = [s for s in args.strategies.split(",") if s]
    calls: dict[str, Callable[[], float]] = {}
    errors: dict[str, str] = {}
    for number, strategy in enumerate(strategies, 1):
        progress(f"compiling and warming up {strategy} ({number}/{len(strategies)})")
        try:
            call = _steady_call(strategy, args)
            for _ in range(1 + args.warmup):
                call()
            calls[strategy] = call
        except Exception as error:  # one strategy failing must not hide the others' numbers
            errors[strategy] = f"{type(error).__name__}: {error}"
    rounds = args.steady_iters
    said = lambda index: progress(f"steady {index + 1}/{rounds} rounds")  # noqa: E731
    samples = alternate_rounds(calls, rounds, rotate=True, after_round=said)
    return {
        "phase": "steady",
        "strategies": strategies,
        "rounds": rounds,
        "calls_per_round": 1,
        "steady_seconds": samples,
        "steady_median_seconds": {s: statistics.median(v) for s, v in samples.items()},
        "steady_min_seconds": {s: min(v) for s, v in samples.items()},
        "errors": errors,
    }


def measure_precompile(args: argparse.Namespace) -> dict[str, Any]:
    """Write the artifact directory for the precompiled strategy (forward, or forward and
    backward with ``--train``)."""
    import torchkiln

    if not args.artifacts:
        raise SystemExit("--precompile needs --artifacts DIR")
    progress("precompiling")
    model, inputs = build(args)
    result = torchkiln.precompile(
        model,
        inputs,
        args.artifacts,
        Strategies(args.backend, args.mode).config("regional"),
        kinds=["training" if args.train else "inference"],
        whole=True,  # the precompiled cell then starts at whole-model speed (issue 21)
    )
    if result.skipped or not result.entries:
        print(result.summary(), file=sys.stderr)
        raise SystemExit("precompile: some region groups could not be precompiled")
    return {
        "phase": "precompile",
        "precompile_seconds": result.seconds,
        "entries": result.entries,
        "skipped": result.skipped,
        "artifacts": args.artifacts,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    started = time.perf_counter()
    import torch  # noqa: F401  (timed: the import is part of start-up)

    torch_import = time.perf_counter() - started
    if args.precompile:
        measured = measure_precompile(args)
    else:
        measured = measure_steady(args) if args.strategies else measure_first_call(args)
    record = run_record(args, START_WALL, torch_import) | measured
    write_result(args.output, record | {"wall_seconds": time.perf_counter() - START})
    return 0


if __name__ == "__main__":
    sys.exit(main())
