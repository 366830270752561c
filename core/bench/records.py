"""In a worker process: what its record says besides the timings: where and how it ran,
Dynamo's own counts, and the torchkiln report's summary."""

from __future__ import annotations

import argparse
import os
from typing import Any

import attrs

from torchkiln.bench.strategies import TORCHKILN_STRATEGIES


def run_record(
    args: argparse.Namespace, started_wall: float, torch_import: float
) -> dict[str, Any]:
    """The fields every worker record starts with."""
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
        "train": args.train,
        "workload": args.workload,
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
