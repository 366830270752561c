"""The ``torchkiln bench`` sub-command."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from torchkiln.bench.settings import (
    DEFAULT_BATCHES,
    DEFAULT_DEPTHS,
    DEFAULT_NEW_TOKENS,
    DEFAULT_SEQ,
    DTYPES,
    EXIT_TARGET_MISSED,
    GPU_BUDGET_MINUTES,
    GPU_DEPTHS,
    GPU_DTYPE,
    GPU_JSON,
    GPU_MODEL,
    GPU_PLOT,
    GPU_STRATEGIES,
    GPU_WORKLOADS,
    JOB_DISTRIBUTED,
    MODES,
    PRESETS,
    QUICK_BATCHES,
    QUICK_DEEPEST_ONLY,
    QUICK_DEPTHS,
    QUICK_EVERY_DEPTH,
    QUICK_STEADY_ITERS,
    QUICK_WARM,
    STRATEGIES,
    WORKLOADS,
)

DESCRIPTION = f"""\
Measure the cold start, warm start and steady state of each compile strategy
({", ".join(STRATEGIES)}; accelerate only when installed). Every cell runs in a fresh
process with an empty inductor cache directory (cold), then in another fresh process
reusing that directory (warm).

Presets (--preset):
  default  a small Llama-family model (torchkiln.examples.llama, no download) at
           depths {",".join(map(str, DEFAULT_DEPTHS))}, batch {",".join(map(str, DEFAULT_BATCHES))}, sequence {DEFAULT_SEQ}, float32, on the CPU.
  quick    README's main job (--quick is an alias): the same model at depths {",".join(map(str, QUICK_DEPTHS))}, batch
           {",".join(map(str, QUICK_BATCHES))}; {", ".join(QUICK_EVERY_DEPTH)} at every depth, {", ".join(QUICK_DEEPEST_ONLY)}
           at depth {max(QUICK_DEPTHS)} only; warm runs for {", ".join(QUICK_WARM)}; steady state at depth {max(QUICK_DEPTHS)},
           {QUICK_STEADY_ITERS} rounds. README states how long it takes.
  gpu      one CUDA GPU: a ~1B-parameter Llama ({GPU_MODEL}) in {GPU_DTYPE} at depths {",".join(map(str, GPU_DEPTHS))},
           workloads {" and ".join(GPU_WORKLOADS)}, compile modes default and reduce-overhead,
           strategies {",".join(GPU_STRATEGIES)} (eager once, in the default-mode runs), no
           warm runs, steady state timed in the first-call process; a {GPU_BUDGET_MINUTES:g}-minute
           --budget-minutes; writes {GPU_JSON} and {GPU_PLOT} unless --json/--plot say otherwise.
           --dry-run prints the plan (works without a GPU).
"""


def add_bench_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``bench`` to the ``torchkiln`` command's sub-parsers."""
    p = subparsers.add_parser(
        "bench", help="measure cold start and steady state: eager, full, regional, hierarchical",
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument(
        "--model",
        help="built-in example (llama, llama-1b, gpt2, toy; default: the preset's), "
        "NAME:DEPTH, or package.module:factory (called with depth=N when --depths is given)",
    )
    p.add_argument(
        "--preset",
        choices=PRESETS,
        help="default (CPU grid), quick (the small CPU grid), gpu (one CUDA GPU, bf16, ~1B "
        "Llama; see above)",
    )
    p.add_argument(
        "--quick", action="store_true", help="alias of --preset quick (minutes on 2 CPU cores)"
    )
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
        help="forward (default), train (forward+backward) or generate (model.generate(): time "
        "to the first token, then seconds per decoded token)",
    )
    p.add_argument(
        "--new-tokens",
        type=int,
        default=DEFAULT_NEW_TOKENS,
        help="tokens per generate() call, --workload generate (default %(default)s)",
    )
    p.add_argument("--device", help="cpu, cuda or auto (default: cpu; cuda with --preset gpu)")
    p.add_argument(
        "--dtype",
        help=f"the model's dtype: {', '.join(DTYPES)} (default float32; {GPU_DTYPE} with "
        "--preset gpu)",
    )
    p.add_argument(
        "--mode",
        help=f"torch.compile mode of every compiled strategy: {', '.join(MODES)} (default: "
        "default). CUDA-graph modes need --device cuda (refused on the CPU, where torch would "
        "ignore them)",
    )
    p.add_argument(
        "--budget-minutes",
        type=float,
        help=f"start no cell after this many minutes; the rest are reported as skipped "
        f"(default: none; {GPU_BUDGET_MINUTES:g} with --preset gpu)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan (runs, cells in order, worker commands, parameter counts) and "
        "run nothing",
    )
    p.add_argument(
        "--steady-iters",
        type=int,
        help="timed calls per run (default 30; with --preset gpu 20 forward, 10 generate)",
    )
    p.add_argument("--no-warm", dest="warm", action="store_false", help="skip the warm-cache runs")
    p.add_argument(
        "--timeout",
        type=float,
        help="seconds one worker process may take (default 1800; 420 with --preset gpu)",
    )
    p.add_argument(
        "--json",
        dest="json_path",
        metavar="FILE",
        help="write every raw number here (rewritten after every cell)",
    )
    p.add_argument(
        "--plot",
        dest="plot_path",
        metavar="FILE.png",
        help="draw first call vs depth and steady state per strategy (needs matplotlib)",
    )
    p.add_argument(
        "--from-json",
        metavar="FILE",
        help="run nothing: print the tables and targets of a JSON file a bench wrote (also one "
        "a stopped run left), and draw --plot from it",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help=f"exit {EXIT_TARGET_MISSED} when a target is NOT met (without it, the targets are "
        "shown and the exit status ignores them)",
    )
    p.add_argument("--cache-root", help="keep the per-cell cache directories under this folder")
    p.add_argument(
        "--ranks",
        type=int,
        help="instead of the grid: launch jobs of this many ranks with torchrun (gloo, this "
        "machine) and compare their cold start, compile CPU time and restart with one rank's "
        "(docs/jobs.md); uses --model, --depths (the first), --batch, --seq, --backend, --json, "
        "--distributed, --checkpointing",
    )
    p.add_argument(
        "--distributed",
        metavar="{" + ",".join(JOB_DISTRIBUTED) + "}",
        help="with --ranks: the jobs' distributed strategy (default ddp). fsdp2: every job, the "
        "one-rank reference included, under torchkiln's FSDP2; runs one rank, N ranks each "
        "compiling, N ranks sharing with a fresh store, and the restart (no full torch.compile "
        "or tiered job)",
    )
    p.add_argument(
        "--checkpointing",
        action="store_true",
        help="with --ranks and --distributed fsdp2: turn on "
        "distributed.fsdp2.activation_checkpointing in every job",
    )
    p.add_argument(
        "--store",
        action="store_true",
        help="instead of the grid: the one-store cell (docs/store.md): full torch.compile cold, "
        "then the same script twice with store=DIR, each in a process of its own; the second "
        "also alternates rounds with full compile in its process; uses --depths (the first), "
        "--backend, --json; --check: exit non-zero unless the second process's compile and "
        "first call take at most 0.1x full's cold ones and its steady state at most 1.02x",
    )
    p.add_argument(
        "--lengths",
        help="with --workload train: comma-separated sequence lengths, one drawn per step (a "
        "seeded generator: the same lengths for every strategy), as a padding collator gives "
        "them; each of --strategies (default full,regional,tiered) trains --steps steps in a "
        "process of its own, and the table gives first step, median step and total, and "
        "where tiered's builder stood",
    )
    p.add_argument(
        "--steps", type=int, default=64, help="training steps per strategy with --lengths"
    )
    p.add_argument(
        "--threads",
        type=int,
        help="with --lengths: torch.set_num_threads in each training process (leave the "
        "tiered builder a core: 1 on a 2-core machine)",
    )
    p.add_argument(
        "--tiered-when",
        choices=("auto", "always"),
        default="auto",
        help="with --lengths: tiered.when for the tiered run (always: start the builder on busy "
        "cores too, to see tiered.max_slowdown bound its cost)",
    )
    p.set_defaults(handler=run_bench)
    return p


def run_bench(args: argparse.Namespace) -> int:
    """Run the bench described by ``args``; 0 when every cell that ran produced numbers
    (cells skipped for the time budget included), else 1; with ``--check``,
    :data:`EXIT_TARGET_MISSED` when they did but a target is NOT met."""
    _check_distributed(args)
    if args.ranks is not None:
        return _run_job_bench(args)
    if args.store:
        from torchkiln.bench.store_restart import bench_store

        json_path = Path(args.json_path) if args.json_path else None
        return bench_store(_first(args.depths, 16), args.backend, 30, json_path, check=args.check)
    if args.lengths is not None:
        return _run_train_lengths(args)
    if args.from_json:
        from torchkiln.bench.execute import replay

        return replay(args.from_json, args.plot_path, check=args.check)
    from torchkiln.bench.execute import run_plan
    from torchkiln.bench.plan import plan_from_args

    return run_plan(plan_from_args(args), args)


def _first(values: str | None, default: int) -> int:
    """The first of comma-separated ``--depths`` or ``--batch`` values (``default``: none)."""
    return int(values.split(",")[0]) if values else default


def _check_distributed(args: argparse.Namespace) -> None:
    """Refuse ``--distributed`` and ``--checkpointing`` where the job bench would not use them."""
    from torchkiln.bench.settings import BenchError

    given = args.distributed
    if given is not None and given not in JOB_DISTRIBUTED:
        raise BenchError(
            f"--distributed {given}: the job bench runs {' or '.join(JOB_DISTRIBUTED)}"
        )
    if given is not None and (args.ranks is None or args.ranks < 2):
        raise BenchError(
            f"--distributed {given}: the strategy of a job bench's jobs; add --ranks N (N >= 2)"
        )
    if args.checkpointing and given != "fsdp2":
        raise BenchError(
            "--checkpointing turns on distributed.fsdp2.activation_checkpointing: add --ranks N "
            "--distributed fsdp2"
        )


def _run_job_bench(args: argparse.Namespace) -> int:
    from torchkiln.bench.jobs import STEPS, run_job_bench, targets
    from torchkiln.bench.settings import BenchError

    if args.ranks < 2:
        raise BenchError(f"--ranks {args.ranks}: a job bench needs at least 2 ranks")
    base = {"model": args.model or "llama", "depth": _first(args.depths, 16),
            "batch": _first(args.batch, 1), "seq": args.seq, "backend": args.backend,
            "steps": STEPS, "distributed": args.distributed or JOB_DISTRIBUTED[0],
            "checkpointing": args.checkpointing}  # fmt: skip
    result = run_job_bench(args.ranks, base, args.json_path, args.timeout or 1800)
    missed = [key for _, key, limit in targets(base) if result["ratios"].get(key, 0) > limit]
    return EXIT_TARGET_MISSED if args.check and missed else 0


def _run_train_lengths(args: argparse.Namespace) -> int:
    from torchkiln.bench.settings import BenchError
    from torchkiln.bench.train_lengths import STRATEGIES, run_train_lengths

    if (args.workload or ("train" if args.train else "forward")) != "train":
        raise BenchError(
            "--lengths draws a sequence length per training step: add --workload train"
        )
    try:
        lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    except ValueError as error:
        raise BenchError(f"--lengths {args.lengths!r}: comma-separated integers") from error
    if not lengths or min(lengths) < 1 or args.steps < 2:
        raise BenchError("--lengths needs positive lengths and --steps of at least 2")
    strategies = tuple(s for s in (args.strategies or ",".join(STRATEGIES)).split(",") if s)
    unknown = [s for s in strategies if s not in ("eager", *STRATEGIES)]
    if unknown:
        raise BenchError(f"--lengths runs eager, {', '.join(STRATEGIES)}; not {', '.join(unknown)}")
    base = {"model": args.model or "llama", "depth": _first(args.depths, 8),
            "batch": _first(args.batch, 2), "lengths": lengths, "steps": args.steps,
            "backend": args.backend, "threads": args.threads, "tiered_when": args.tiered_when,
            "alternate": 30}  # fmt: skip
    run_train_lengths(strategies, base, args.json_path, args.timeout or 3600)
    return 0
