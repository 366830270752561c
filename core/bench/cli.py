"""The ``torchkiln bench`` sub-command."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from torchkiln.bench.environment import collect_environment
from torchkiln.bench.runner import run_bench_cells
from torchkiln.bench.settings import (
    DEFAULT_BATCHES,
    DEFAULT_DEPTHS,
    DEFAULT_NEW_TOKENS,
    DEFAULT_SEQ,
    QUICK_BATCHES,
    QUICK_DEPTHS,
    STRATEGIES,
    WORKLOADS,
    make_settings,
)
from torchkiln.bench.table import render_all
from torchkiln.bench.targets import check_targets

JSON_FORMAT_VERSION = 1

DESCRIPTION = f"""\
Measure the cold start, warm start and steady state of each compile strategy
({", ".join(STRATEGIES)}; accelerate only when installed). Every cell runs in a fresh
process with an empty inductor cache directory (cold), then in another fresh process
reusing that directory (warm).

Default workload: a small Llama-family model (torchkiln.examples.llama, no download) at
depths {",".join(map(str, DEFAULT_DEPTHS))}, batch {",".join(map(str, DEFAULT_BATCHES))}, sequence {DEFAULT_SEQ}.
--quick: depths {",".join(map(str, QUICK_DEPTHS))}, batch {",".join(map(str, QUICK_BATCHES))}.
"""


def add_bench_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``bench`` to the ``torchkiln`` command's sub-parsers."""
    p = subparsers.add_parser(
        "bench", help="measure cold start and steady state: eager, full, regional, hierarchical",
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument(
        "--model",
        default="llama",
        help="built-in example (llama, gpt2, toy), "
        "NAME:DEPTH, or package.module:factory (called with depth=N when --depths is given)",
    )
    p.add_argument("--quick", action="store_true", help="the small preset (minutes on 2 CPU cores)")
    p.add_argument("--depths", help="comma-separated block counts (default: the preset's)")
    p.add_argument("--batch", help="comma-separated batch sizes (default: the preset's)")
    p.add_argument(
        "--seq", type=int, default=DEFAULT_SEQ, help="sequence length (default %(default)s)"
    )
    p.add_argument("--strategies", help=f"comma-separated subset of {','.join(STRATEGIES)}")
    p.add_argument(
        "--backend", default="inductor", help="torch.compile backend (default %(default)s)"
    )
    p.add_argument(
        "--train", action="store_true", help="measure forward+backward (--workload train)"
    )
    p.add_argument(
        "--workload",
        choices=WORKLOADS,
        default=None,
        help="forward (default), train (forward+backward) or generate (model.generate(): time "
        "to the first token, then seconds per decoded token)",
    )
    p.add_argument(
        "--new-tokens",
        type=int,
        default=DEFAULT_NEW_TOKENS,
        help="tokens per generate() call, --workload generate (default %(default)s)",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto (default %(default)s)")
    p.add_argument(
        "--steady-iters", type=int, default=30, help="timed calls per run (default %(default)s)"
    )
    p.add_argument("--no-warm", dest="warm", action="store_false", help="skip the warm-cache runs")
    p.add_argument(
        "--timeout",
        type=float,
        default=1800.0,
        help="seconds one worker process may take (default %(default)s)",
    )
    p.add_argument("--json", dest="json_path", metavar="FILE", help="write every raw number here")
    p.add_argument(
        "--plot",
        dest="plot_path",
        metavar="FILE.png",
        help="draw first call vs depth and steady state per strategy (needs matplotlib)",
    )
    p.add_argument("--cache-root", help="keep the per-cell cache directories under this folder")
    p.set_defaults(handler=run_bench)
    return p


def run_bench(args: argparse.Namespace) -> int:
    """Run the bench described by ``args``; 0 when every cell produced numbers, else 1."""
    settings = make_settings(
        model=args.model, quick=args.quick, depths=args.depths, batch=args.batch, seq=args.seq,
        strategies=args.strategies, backend=args.backend, train=args.train, device=args.device,
        steady_iters=args.steady_iters, warm=args.warm, timeout=args.timeout,
        workload=args.workload, new_tokens=args.new_tokens,
    )  # fmt: skip
    if args.plot_path:
        from torchkiln.bench.plot import require_matplotlib

        require_matplotlib()
    environment = collect_environment(settings.device)
    started = time.perf_counter()
    results = run_bench_cells(settings, cache_root=args.cache_root)
    wall = time.perf_counter() - started
    targets = check_targets(results, settings.workload)
    print(render_all(settings.to_dict(), environment, results, targets))
    print(f"\n{len(results)} cells in {wall / 60:.1f} min")
    if args.json_path:
        document = {
            "torchkiln_bench": JSON_FORMAT_VERSION,
            "settings": settings.to_dict(),
            "environment": environment,
            "wall_seconds": wall,
            "cells": [r.to_dict() for r in results],
            "targets": [t.to_dict() for t in targets],
        }
        _write_json(Path(args.json_path), document)
        print(f"wrote {args.json_path}")
    if args.plot_path:
        from torchkiln.bench.plot import write_plot

        write_plot(
            results,
            args.plot_path,
            f"torchkiln bench: {settings.model}, backend {settings.backend}",
        )
        print(f"wrote {args.plot_path}")
    return 0 if all(r.failure is None for r in results) else 1


def _write_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
