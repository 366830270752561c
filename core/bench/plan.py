"""What one ``torchkiln bench`` command will run: its runs, their order, its budget, its outputs.

The default and quick presets are one run (one :class:`BenchSettings` grid); the gpu preset is
several (:func:`torchkiln.bench.presets.gpu_plan`), executed depth by depth.
"""

from __future__ import annotations

import argparse
import sys

import attrs

from torchkiln.bench.presets import (
    GPU_BATCHES,
    GPU_BUDGET_MINUTES,
    GPU_DEPTHS,
    GPU_DTYPE,
    GPU_JSON,
    GPU_MODEL,
    GPU_MODES,
    GPU_PLOT,
    GPU_STEADY_ITERS,
    GPU_STRATEGIES,
    GPU_TIMEOUT,
    Step,
    execution_order,
    gpu_plan,
)
from torchkiln.bench.settings import (
    DEFAULT_MODEL,
    BenchError,
    BenchSettings,
    accelerate_available,
    check_mode,
    make_settings,
    release_problem,
)

DEFAULT_TIMEOUT = 1800.0


@attrs.frozen
class BenchPlan:
    """The runs of one bench command, and what frames them."""

    preset: str
    runs: tuple[BenchSettings, ...]
    budget_minutes: float | None = None
    """No cell starts once this many minutes have passed (``None``: no budget)."""
    json_path: str | None = None
    plot_path: str | None = None

    @property
    def budget_seconds(self) -> float | None:
        return None if self.budget_minutes is None else self.budget_minutes * 60.0

    def steps(self) -> list[Step]:
        """The runs at each depth in execution order (the gpu preset: most valuable first);
        a one-run plan is one step with all its depths, in the order given."""
        if len(self.runs) == 1:
            return [Step(0, self.runs[0])]
        return execution_order(list(self.runs))


def _preset(args: argparse.Namespace) -> str:
    if args.quick and args.preset not in (None, "quick"):
        raise BenchError(f"--quick with --preset {args.preset}: --quick means --preset quick")
    return "quick" if args.quick else (args.preset or "default")


def _budget(minutes: float | None) -> float | None:
    if minutes is not None and minutes <= 0:
        raise BenchError(f"--budget-minutes {minutes:g}: must be > 0")
    return minutes


def settings_from_args(args: argparse.Namespace, preset: str = "default") -> BenchSettings:
    """The one run of the default or quick preset, validated."""
    return make_settings(
        model=args.model or DEFAULT_MODEL, quick=preset == "quick", depths=args.depths,
        batch=args.batch, seq=args.seq, strategies=args.strategies, backend=args.backend,
        train=args.train, device=args.device or "cpu",
        steady_iters=args.steady_iters, warm=args.warm,
        timeout=args.timeout or DEFAULT_TIMEOUT, workload=args.workload,
        new_tokens=args.new_tokens, dtype=args.dtype or "float32", mode=args.mode,
        dispatch=getattr(args, "dispatch", None), check_device=not getattr(args, "dry_run", False),
    )  # fmt: skip


def _gpu_strategies(args: argparse.Namespace) -> str:
    """``--strategies``, else the preset's, less those this torch lacks (said on stderr: the
    GPU machine runs torch 2.11, which has no ``aot_compile`` for ``tiered``)."""
    if args.strategies:
        return str(args.strategies)
    chosen = []
    for strategy in GPU_STRATEGIES:
        problem = release_problem(strategy)
        if problem is not None:
            print(
                f"torchkiln bench: --preset gpu leaves out {strategy}: {problem}", file=sys.stderr
            )
        elif strategy != "accelerate" or accelerate_available():
            chosen.append(strategy)
    return ",".join(chosen)


def gpu_runs(args: argparse.Namespace) -> list[BenchSettings]:
    """The gpu preset's runs, with the grid options the command line may change."""
    for option, value in (("--workload", args.workload), ("--mode", args.mode)):
        if value is not None:
            raise BenchError(
                f"--preset gpu fixes {option} (its runs are forward and generate, modes default "
                "and reduce-overhead); drop it, or use --preset default"
            )
    if args.train:
        raise BenchError("--preset gpu measures forward and generate; --train is not part of it")
    base = make_settings(
        model=args.model or GPU_MODEL, depths=args.depths or ",".join(map(str, GPU_DEPTHS)),
        batch=args.batch or ",".join(map(str, GPU_BATCHES)), seq=args.seq,
        strategies=_gpu_strategies(args), backend=args.backend, device=args.device or "cuda",
        steady_iters=args.steady_iters or GPU_STEADY_ITERS["forward"], warm=False,
        timeout=args.timeout or GPU_TIMEOUT, new_tokens=args.new_tokens,
        dtype=args.dtype or GPU_DTYPE, check_device=not args.dry_run,
    )  # fmt: skip
    for mode in GPU_MODES:
        check_mode(mode, base.device)
    given = {"steady_iters": base.steady_iters} if args.steady_iters else {}
    return gpu_plan(
        strategies=base.strategies, depths=base.depths, device=base.device, model=base.model,
        batches=base.batches, seq=base.seq, backend=base.backend, dtype=base.dtype,
        timeout=base.timeout, new_tokens=base.new_tokens, **given,
    )  # fmt: skip


def plan_from_args(args: argparse.Namespace) -> BenchPlan:
    """Validate the command line into a :class:`BenchPlan`.

    :raises BenchError: naming the bad option and what is allowed.
    """
    preset = _preset(args)
    budget = _budget(args.budget_minutes)
    if preset != "gpu":
        return BenchPlan(
            preset, (settings_from_args(args, preset),), budget, args.json_path, args.plot_path
        )
    return BenchPlan(
        "gpu",
        tuple(gpu_runs(args)),
        GPU_BUDGET_MINUTES if budget is None else budget,
        args.json_path or GPU_JSON,
        args.plot_path or GPU_PLOT,
    )
