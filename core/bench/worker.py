"""One bench measurement, in a process of its own: ``python -m torchkiln.bench.worker``.

The runner starts one worker per cell and run (cold, then warm), each with the inductor cache
directory it chose in ``TORCHINDUCTOR_CACHE_DIR``, so nothing compiled by an earlier cell (or
an earlier run of this cell, for the cold run) can be reused in memory or on disk.

The worker builds the model, applies one strategy, and measures:

* ``first_call_seconds``: applying the strategy plus the first call (forward, or forward and
  backward with ``--train``), where compilation happens;
* ``steady_seconds``: every timed call after ``--warmup`` calls (the runner reports the median);
* Dynamo's own counts: graphs compiled, recompiles, graph breaks, inductor/AOTAutograd cache
  hits and misses, Dynamo's compile seconds;
* ``max_abs_diff``: the compiled first output against the same model run eagerly afterwards.

It writes one JSON object to ``--output``.
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

START = time.perf_counter()
START_WALL = time.time()


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m torchkiln.bench.worker")
    p.add_argument("--model", required=True)
    p.add_argument("--depth", type=int, default=None)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--strategy", required=True)
    p.add_argument("--backend", default="inductor")
    p.add_argument("--device", default="cpu")
    p.add_argument("--train", action="store_true")
    p.add_argument("--steady-iters", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--output", required=True)
    p.add_argument(
        "--spawned-at",
        type=float,
        default=None,
        help="time.time() when the runner started this process (to measure startup)",
    )
    return p.parse_args(argv)


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

    from torchkiln.examples import example_inputs, load_model

    kwargs = {"depth": args.depth} if args.depth is not None else {}
    model = load_model(args.model, **kwargs).to(args.device)
    model.train(args.train)
    name, _, factory = args.model.partition(":")
    make_inputs = example_inputs
    if factory and not factory.isdigit():
        # A custom model module may say how to feed it: example_inputs(model, batch, seq).
        make_inputs = getattr(importlib.import_module(name), "example_inputs", example_inputs)
    inputs = make_inputs(model, args.batch, args.seq)
    return model, inputs.to(args.device) if hasattr(inputs, "to") else inputs


def _apply_strategy(strategy: str, model: Any, backend: str) -> Any:
    """Return the callable to measure; compilation itself stays lazy (first call)."""
    import torch

    if strategy == "eager":
        return model
    if strategy == "full":
        return torch.compile(model, backend=backend)
    if strategy in ("regional", "hierarchical"):
        import torchkiln
        from torchkiln.config import CompileConfig, RegionsConfig

        selector = "auto" if strategy == "regional" else "hierarchical"
        # A complete CompileConfig: no YAML file or TORCHKILN_* variable can change the cell.
        config = CompileConfig(
            backend=backend, regions=RegionsConfig(strategy=selector), progress="off"
        )
        return torchkiln.compile(model, config)
    if strategy == "accelerate":
        from accelerate.utils import compile_regions

        return compile_regions(model, backend=backend)
    raise SystemExit(f"unknown strategy {strategy!r}")


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def _step(fn: Any, inputs: Any, train: bool) -> Callable[[], Any]:
    import torch

    def forward() -> Any:
        with torch.no_grad():
            return fn(inputs)

    def forward_backward() -> Any:
        output = fn(inputs)
        _first_tensor(output).float().mean().backward()
        return output

    return forward_backward if train else forward


def _timed(call: Callable[[], Any], device: str) -> tuple[float, Any]:
    _sync(device)
    started = time.perf_counter()
    result = call()
    _sync(device)
    return time.perf_counter() - started, result


def _dynamo_counts() -> dict[str, Any]:
    import torch._dynamo.utils as dynamo_utils

    counters = dynamo_utils.counters
    metrics = list(dynamo_utils.get_compilation_metrics())
    inductor = counters["inductor"]
    aot = counters["aot_autograd"]
    return {
        "graphs": int(counters["stats"]["unique_graphs"]),
        "frames_compiled": len(metrics),
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
    }


def _torchkiln_report(strategy: str, model: Any) -> dict[str, Any] | None:
    if strategy not in ("regional", "hierarchical"):
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
    }


def _eager_reference(strategy: str, model: Any, inputs: Any, compiled_out: Any) -> float:
    """Largest absolute difference between the compiled first output and eager."""
    import torch

    if strategy in ("regional", "hierarchical"):
        import torchkiln

        torchkiln.decompile(model)
    # full and accelerate leave the original module untouched (they return new objects).
    with torch.no_grad():
        reference = _first_tensor(model(inputs)).float()
    return float((compiled_out.float() - reference).abs().max().item())


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    imported = time.perf_counter()
    model, inputs = _build(args)
    built = time.perf_counter()
    call_target = None

    def first() -> Any:
        nonlocal call_target
        call_target = _apply_strategy(args.strategy, model, args.backend)
        return _step(call_target, inputs, args.train)()

    first_seconds, output = _timed(first, args.device)
    first_out = _first_tensor(output).detach()
    counts_after_first = _dynamo_counts()
    step = _step(call_target, inputs, args.train)
    for _ in range(args.warmup):
        _timed(step, args.device)
    steady = [_timed(step, args.device)[0] for _ in range(args.steady_iters)]
    counts = _dynamo_counts()
    report = _torchkiln_report(args.strategy, model)
    return {
        "strategy": args.strategy,
        "model": args.model,
        "depth": args.depth,
        "batch": args.batch,
        "seq": args.seq,
        "backend": args.backend,
        "device": args.device,
        "train": args.train,
        "first_call_seconds": first_seconds,
        "steady_seconds": steady,
        "steady_median_seconds": statistics.median(steady),
        "steady_min_seconds": min(steady),
        # ``python -m torchkiln.bench.worker`` imports torch before this module runs, so
        # start-up (interpreter, torch, torchkiln) is measured from the runner's clock.
        "startup_seconds": START_WALL - args.spawned_at if args.spawned_at is not None else None,
        "build_seconds": built - imported,
        "first_call": counts_after_first,
        "after_steady": counts,
        "torchkiln_report": report,
        "max_abs_diff": _eager_reference(args.strategy, model, inputs, first_out),
        "threads": torch.get_num_threads(),
        "cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
        "parameters": sum(p.numel() for p in model.parameters()),
        "torch": torch.__version__,
        "load_average": list(os.getloadavg()),
        "wall_seconds": time.perf_counter() - START,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    result = measure(args)
    with open(args.output, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
