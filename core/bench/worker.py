"""One bench measurement, in a process of its own: ``python -m torchkiln.bench.worker``.

Two kinds of run, each with the inductor cache directory the runner chose in
``TORCHINDUCTOR_CACHE_DIR``:

``--strategy NAME`` (first call): builds the model, applies one strategy and measures

* ``first_call_seconds``: applying the strategy plus the first call (forward, or forward and
  backward with ``--train``), where compilation happens;
* Dynamo's own counts after the first call and after ``--warmup`` more calls: graphs compiled,
  recompiles, graph breaks, inductor/AOTAutograd cache hits and misses, compile seconds;
* ``max_abs_diff``: the compiled first output against the same model run eagerly afterwards.

The runner starts it in a fresh process with an empty cache directory (cold), then in another
fresh process with that directory kept (warm).

``--strategies A,B,...`` (steady state): one model copy per strategy, each compiled and
warmed up, then timed in alternating rounds (``steady_seconds`` per strategy); the runner
gives it the cache directories the first-call runs filled, so its compiles are warm.

It writes one JSON object to ``--output``, and progress lines (``PROGRESS_PREFIX`` then what
it is doing, ``steady 7/10`` for counted work) to stderr, which the runner shows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

START = time.perf_counter()
START_WALL = time.time()
PROGRESS_PREFIX = "torchkiln-bench-progress: "
"""Starts every progress line on stderr (the runner's :func:`~torchkiln.bench.runner.run_worker`
reads them; kept here so this module imports nothing of torchkiln before it is timed)."""


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


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m torchkiln.bench.worker")
    p.add_argument("--model", required=True)
    p.add_argument("--depth", type=int, default=None)
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
    p.add_argument("--mode", default=None, help="torch.compile mode of every compiled strategy")
    p.add_argument("--dispatch", default=None, help="the torchkiln strategies' dispatch setting")
    p.add_argument(
        "--steady-here",
        action="store_true",
        help="--strategy: also time --steady-iters calls after the warm-up (steady_seconds)",
    )
    p.add_argument("--train", action="store_true")
    p.add_argument("--workload", choices=("forward", "train", "generate"), default=None)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--steady-iters", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--output", required=True)
    p.add_argument(
        "--spawned-at",
        type=float,
        default=None,
        help="time.time() when the runner started this process (to measure startup)",
    )
    args = p.parse_args(argv)
    if args.workload is None:
        args.workload = "train" if args.train else "forward"
    args.train = args.workload == "train"
    return args


def _first_tensor(output: Any) -> Any:
    """The main tensor of a model output (a tensor, ``ModelOutput.logits``, or element 0)."""
    import torch

    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, list | tuple) and output:
        return _first_tensor(output[0])
    raise TypeError(f"cannot find a tensor in the model output ({type(output).__name__})")


def _build(args: argparse.Namespace) -> tuple[Any, Any]:
    import importlib

    import torch

    from torchkiln.examples import BUILDS_ON_DEVICE, example_inputs, load_model

    kwargs: dict[str, Any] = {"depth": args.depth} if args.depth is not None else {}
    dtype = getattr(torch, args.dtype)
    if args.model.partition(":")[0] in BUILDS_ON_DEVICE:
        # Built where it runs, in its dtype: no float32 copy on the CPU first.
        model = load_model(args.model, device=args.device, dtype=dtype, **kwargs)
    else:
        model = load_model(args.model, **kwargs).to(device=args.device, dtype=dtype)
    model.train(args.train)
    name, _, factory = args.model.partition(":")
    make_inputs = example_inputs
    if factory and not factory.isdigit():
        # A custom model module may say how to feed it: example_inputs(model, batch, seq).
        make_inputs = getattr(importlib.import_module(name), "example_inputs", example_inputs)
    inputs = make_inputs(model, args.batch, args.seq)
    return model, inputs.to(args.device) if hasattr(inputs, "to") else inputs


TORCHKILN_STRATEGIES = ("regional", "hierarchical", "precompiled", "tiered")

DISPATCH: list[str | None] = [None]
"""``--dispatch``, set once by :func:`main` (every torchkiln strategy of the process uses it)."""


def _config(
    strategy: str,
    backend: str,
    artifacts: str | None = None,
    mode: str | None = None,
    tiered_artifacts: str | None = None,
) -> Any:
    """A complete CompileConfig: no YAML file or TORCHKILN_* variable can change the cell.
    The precompiled strategy loads strictly: artifacts that do not fit fail the cell rather
    than compile normally and pass for loaded. The tiered strategy's builder writes into
    ``tiered_artifacts``; a run that finds the whole-model form there starts from it."""
    from torchkiln.configuration.config import CompileConfig, RegionsConfig, TieredConfig

    selector = "hierarchical" if strategy == "hierarchical" else "auto"
    extra: dict[str, Any] = (
        {"artifacts": artifacts, "artifacts_strict": True} if strategy == "precompiled" else {}
    )
    if strategy == "tiered":
        # The cell measures the tiered form itself, how soon it can switch: the builder starts
        # whatever tiered.when's auto would decide on this machine, and is not paused for the
        # back-to-back calls it slows (tiered.max_slowdown 0; docs/benchmarks.md says so). The
        # training bench (--lengths) measures the defaults.
        extra["tiered"] = TieredConfig(enabled=True, when="always", max_slowdown=0)
        if tiered_artifacts:
            extra["artifacts"] = tiered_artifacts
    if DISPATCH[0] is not None:
        extra["dispatch"] = DISPATCH[0]
    return CompileConfig(
        backend=backend,
        mode=mode,
        regions=RegionsConfig(strategy=selector),
        progress="off",
        **extra,
    )


def _apply_strategy(
    strategy: str,
    model: Any,
    backend: str,
    artifacts: str | None = None,
    mode: str | None = None,
    tiered_artifacts: str | None = None,
) -> Any:
    """Return the callable to measure; compilation itself stays lazy (first call).
    ``mode`` goes to every compiled strategy's ``torch.compile``."""
    import torch

    if strategy == "eager":
        return model
    if strategy == "full":
        return torch.compile(model, backend=backend, mode=mode)
    if strategy in TORCHKILN_STRATEGIES:
        import torchkiln

        if strategy == "precompiled" and not artifacts:
            raise SystemExit("the precompiled strategy needs --artifacts DIR")
        config = _config(strategy, backend, artifacts, mode, tiered_artifacts)
        return torchkiln.compile(model, config)
    if strategy == "accelerate":
        from accelerate.utils import compile_regions

        return compile_regions(model, backend=backend, mode=mode)
    raise SystemExit(f"unknown strategy {strategy!r}")


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def _step(fn: Any, model: Any, inputs: Any, train: bool) -> Callable[[], Any]:
    import torch

    def forward() -> Any:
        with torch.no_grad():
            return fn(inputs)

    def forward_backward() -> Any:
        model.zero_grad(set_to_none=True)  # as a training step would, so grads never pile up
        output = fn(inputs)
        _first_tensor(output).float().mean().backward()
        return output

    return forward_backward if train else forward


def _synced(call: Callable[[], Any], device: str) -> Callable[[], Any]:
    def synced() -> Any:
        result = call()
        _sync(device)
        return result

    return synced


def _timed(call: Callable[[], Any], device: str) -> tuple[float, Any]:
    _sync(device)
    started = time.perf_counter()
    result = call()
    _sync(device)
    return time.perf_counter() - started, result


def _dynamo_counts() -> dict[str, Any]:
    from torchkiln._internals import dynamo

    counters = dynamo.counters()
    metrics = dynamo.compilation_metrics()
    inductor = counters["inductor"]
    aot = counters["aot_autograd"]
    return {
        "graphs": int(counters["stats"]["unique_graphs"]),
        # Records without a frame (loading a precompiled inductor function) are not frames.
        "frames_compiled": sum(1 for m in metrics if getattr(m, "co_name", None)),
        "recompiles": sum(1 for m in metrics if getattr(m, "recompile_reason", None)),
        "recompile_reasons": [
            m.recompile_reason for m in metrics if getattr(m, "recompile_reason", None)
        ],
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


def _torchkiln_report(strategy: str, model: Any) -> dict[str, Any] | None:
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


def _eager_reference(strategy: str, model: Any, inputs: Any, compiled_out: Any) -> float:
    """Largest absolute difference between the compiled first output and eager."""
    import torch

    if strategy in TORCHKILN_STRATEGIES:
        import torchkiln

        torchkiln.decompile(model)
    # full and accelerate leave the original module untouched (they return new objects).
    with torch.no_grad():
        reference = _first_tensor(model(inputs)).float()
    return float((compiled_out.float() - reference).abs().max().item())


def _common(args: argparse.Namespace, torch_import_seconds: float) -> dict[str, Any]:
    import torch

    return {
        "model": args.model,
        "depth": args.depth,
        "batch": args.batch,
        "seq": args.seq,
        "backend": args.backend,
        "device": args.device,
        "dtype": args.dtype,
        "mode": args.mode,
        "dispatch": args.dispatch,
        "train": args.train,
        "workload": args.workload,
        "startup_seconds": START_WALL - args.spawned_at if args.spawned_at is not None else None,
        "torch_import_seconds": torch_import_seconds,
        "threads": torch.get_num_threads(),
        "cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
        "torch": torch.__version__,
        "load_average": list(os.getloadavg()),
    }


def measure_first_call(args: argparse.Namespace) -> dict[str, Any]:
    """Apply one strategy and time the first call; then a few more calls to catch recompiles."""
    started = time.perf_counter()
    import torch  # noqa: F401  (timed: the import is part of start-up)

    imported = time.perf_counter()
    if args.workload == "generate":
        progress("first generate() (compiling)")
        return _common(args, imported - started) | _first_token(args, started)
    progress("building the model")
    model, inputs = _build(args)
    built = time.perf_counter()
    call_target = None

    def first() -> Any:
        nonlocal call_target
        call_target = _apply_strategy(
            args.strategy, model, args.backend, args.artifacts, args.mode, args.tiered_artifacts
        )
        return _step(call_target, model, inputs, args.train)()

    first_started = time.perf_counter()
    progress("first call (compiling)")
    first_seconds, output = _timed(first, args.device)
    # A copy: under CUDA graphs (reduce-overhead) the next replay overwrites the output.
    first_out = _first_tensor(output).detach().clone()
    counts_after_first = _dynamo_counts()
    step = _step(call_target, model, inputs, args.train)
    tiered = None
    if args.strategy == "tiered":
        from torchkiln.bench.tiered import now, until_whole_model

        progress("regional until the whole-model form replaces it")
        tiered = until_whole_model(_synced(step, args.device), model, first_started, now)
    later = _counted("warm-up", args.warmup, lambda: _timed(step, args.device)[0])
    steady = _counted(
        "steady", args.steady_iters if args.steady_here else 0, lambda: _timed(step, args.device)[0]
    )
    return _common(args, imported - started) | {
        "phase": "first_call",
        "strategy": args.strategy,
        "first_call_seconds": first_seconds,
        "later_calls_seconds": later,
        "steady_seconds": steady or None,
        "output_dtype": str(first_out.dtype).removeprefix("torch."),
        "build_seconds": built - imported,
        "first_call": counts_after_first,
        "after_later_calls": _dynamo_counts(),
        "torchkiln_report": _torchkiln_report(args.strategy, model),
        "tiered": tiered,
        "max_abs_diff": _eager_reference(args.strategy, model, inputs, first_out),
        "parameters": sum(p.numel() for p in model.parameters()),
        "wall_seconds": time.perf_counter() - START,
    }


def _applier(args: argparse.Namespace) -> Callable[[str, Any, str], Any]:
    """``_apply_strategy`` with this run's artifacts directory (the precompiled strategy) and
    compile mode."""
    return lambda strategy, model, backend: _apply_strategy(
        strategy, model, backend, args.artifacts, args.mode, args.tiered_artifacts
    )


def _first_token(args: argparse.Namespace, started: float) -> dict[str, Any]:
    from torchkiln.bench.generate import first_token

    result, target = first_token(args, _build, _applier(args))
    after = _dynamo_counts()
    return result | {
        "phase": "first_call",
        "strategy": args.strategy,
        # Dynamo's counts after the first generate() (prefill and decode steps), and after the
        # later calls: the decode steps compile during the first call.
        "first_call": after,
        "after_later_calls": after,
        "torchkiln_report": _torchkiln_report(args.strategy, target),
        "wall_seconds": time.perf_counter() - START,
    }


def _steady_step(strategy: str, args: argparse.Namespace) -> Callable[[], Any]:
    """One timed call of ``strategy``'s model: a step, or a generate (seconds per token)."""
    model, inputs = _build(args)
    if args.workload == "generate":
        from torchkiln.bench.generate import generation_target, steady_decode

        target = generation_target(strategy, model, args.backend, _applier(args), args.mode)
        step = steady_decode(target, inputs, args.new_tokens)
    else:
        target = _apply_strategy(
            strategy, model, args.backend, args.artifacts, args.mode, args.tiered_artifacts
        )
        step = _step(target, model, inputs, args.train)
    if strategy == "tiered":
        from torchkiln.bench.tiered import switched

        return switched(step, model)
    return step


def measure_steady(args: argparse.Namespace) -> dict[str, Any]:
    """Steady state of every strategy in one process, timed in alternating rounds.

    Each strategy gets its own copy of the model (same seed, same weights). Timing them
    round-robin in one process exposes all of them to the same machine load, so their ratios
    stay meaningful on a busy machine where separate processes would not.
    """
    started = time.perf_counter()
    import torch  # noqa: F401  (timed: the import is part of start-up)

    imported = time.perf_counter()
    strategies = [s for s in args.strategies.split(",") if s]
    steps: dict[str, Callable[[], Any]] = {}
    errors: dict[str, str] = {}
    for number, strategy in enumerate(strategies, 1):
        progress(f"compiling and warming up {strategy} ({number}/{len(strategies)})")
        try:
            steps[strategy] = _steady_step(strategy, args)
            for _ in range(1 + args.warmup):
                _timed(steps[strategy], args.device)
        except Exception as error:  # one strategy failing must not hide the others' numbers
            steps.pop(strategy, None)
            errors[strategy] = f"{type(error).__name__}: {error}"
    # One call per strategy per round: the finest interleaving, so a burst of load from
    # elsewhere lands on every strategy alike.
    per_round = 1
    rounds = args.steady_iters
    samples: dict[str, list[float]] = {s: [] for s in steps}
    order = list(steps)
    generate = args.workload == "generate"
    for round_index in range(rounds):
        shift = round_index % max(len(order), 1)
        for strategy in order[shift:] + order[:shift]:  # rotate: nobody always goes first
            for _ in range(per_round):
                seconds, per_token = _timed(steps[strategy], args.device)
                # generate: the call's median seconds per decoded token, not the whole call
                samples[strategy].append(per_token if generate else seconds)
        progress(f"steady {round_index + 1}/{rounds} rounds")
    return _common(args, imported - started) | {
        "phase": "steady",
        "strategies": strategies,
        "rounds": rounds,
        "calls_per_round": per_round,
        "steady_seconds": samples,
        "steady_median_seconds": {s: statistics.median(v) for s, v in samples.items()},
        "steady_min_seconds": {s: min(v) for s, v in samples.items()},
        "errors": errors,
        "wall_seconds": time.perf_counter() - START,
    }


def measure_precompile(args: argparse.Namespace) -> dict[str, Any]:
    """Write the artifact directory for the precompiled strategy (forward, or forward and
    backward with ``--train``)."""
    started = time.perf_counter()
    import torch  # noqa: F401

    import torchkiln

    imported = time.perf_counter()
    if not args.artifacts:
        raise SystemExit("--precompile needs --artifacts DIR")
    progress("precompiling")
    model, inputs = _build(args)
    kind = "training" if args.train else "inference"
    result = torchkiln.precompile(
        model,
        inputs,
        args.artifacts,
        _config("regional", args.backend, mode=args.mode),
        kinds=[kind],
        whole=True,  # the precompiled cell then starts at whole-model speed (issue 21)
    )
    if result.skipped or not result.entries:
        print(result.summary(), file=sys.stderr)
        raise SystemExit("precompile: some region groups could not be precompiled")
    return _common(args, imported - started) | {
        "phase": "precompile",
        "precompile_seconds": result.seconds,
        "entries": result.entries,
        "skipped": result.skipped,
        "artifacts": args.artifacts,
        "wall_seconds": time.perf_counter() - START,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    DISPATCH[0] = args.dispatch
    if args.precompile:
        result = measure_precompile(args)
    else:
        result = measure_steady(args) if args.strategies else measure_first_call(args)
    with open(args.output, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
