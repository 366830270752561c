"""What one ``torchkiln bench`` command will run: its runs, their order, its budget, its outputs,
and ``--dry-run``'s account of them (nothing run; works without a GPU).

The default and quick presets are one run (one :class:`BenchSettings` grid); the gpu preset is
one run per workload and compile mode, executed depth by depth, most valuable first
(:func:`execution_order`), so that when the time budget runs out what is missing is what
matters least.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import attrs

from torchkiln.bench.runner import BUDGET_GRACE_SECONDS, worker_command
from torchkiln.bench.settings import (
    DEFAULT_MODEL,
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
    GPU_WORKLOADS,
    BenchError,
    BenchSettings,
    Cell,
    accelerate_available,
    check_mode,
    make_settings,
    release_problem,
)

DEFAULT_TIMEOUT = 1800.0


def run_context(workload: str, mode: str | None) -> str:
    """What tells a run apart from a plan's others: ``forward, mode default``."""
    return f"{workload}, mode {mode or 'default'}"


@attrs.frozen
class Step:
    """One run of the plan at one depth: what executes as a unit, in plan order."""

    run: int
    """Index of the run in the plan."""
    settings: BenchSettings
    """The run's settings narrowed to this one depth."""

    @property
    def context(self) -> str:
        return run_context(self.settings.workload, self.settings.mode)


def execution_order(plan: list[BenchSettings]) -> list[Step]:
    """Every run at every depth, ordered by value: deeper first; within a depth the default
    mode before the others; within a mode the runs in plan order (forward, then generate)."""
    steps = [
        Step(index, attrs.evolve(run, depths=(depth,)))
        for index, run in enumerate(plan)
        for depth in run.depths
    ]
    modes = list(dict.fromkeys(run.mode for run in plan))

    def value(step: Step) -> tuple[int, int, int]:
        deeper_first = -(step.settings.depths[0] or 0)
        return (deeper_first, modes.index(step.settings.mode), step.run)

    return sorted(steps, key=value)


@attrs.frozen
class BenchPlan:
    """The runs of one bench command, and what frames them."""

    preset: str
    runs: tuple[BenchSettings, ...]
    budget_minutes: float | None = None
    """No cell starts once this many minutes have passed (``None``: no budget)."""
    json_path: str | None = None
    plot_path: str | None = None

    def steps(self) -> list[Step]:
        """The runs at each depth in execution order (the gpu preset: most valuable first);
        a one-run plan is one step with all its depths, in the order given."""
        if len(self.runs) == 1:
            return [Step(0, self.runs[0])]
        return execution_order(list(self.runs))


def settings_from_args(args: argparse.Namespace, preset: str = "default") -> BenchSettings:
    """The one run of the default or quick preset, validated."""
    return make_settings(
        model=args.model or DEFAULT_MODEL, quick=preset == "quick", depths=args.depths,
        batch=args.batch, seq=args.seq, strategies=args.strategies, backend=args.backend,
        train=args.train, device=args.device or "cpu",
        steady_iters=args.steady_iters, warm=args.warm,
        timeout=args.timeout or DEFAULT_TIMEOUT, workload=args.workload,
        new_tokens=args.new_tokens, dtype=args.dtype or "float32", mode=args.mode,
        check_device=not getattr(args, "dry_run", False),
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
    """The gpu preset's runs, one per compile mode and workload, with the grid options the
    command line may change. ``eager`` does not depend on the compile mode, so it runs only
    in the default-mode runs."""
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
    runs = [
        attrs.evolve(
            base,
            strategies=tuple(s for s in base.strategies if mode is None or s != "eager"),
            workload=workload,
            mode=mode,
            steady_iters=args.steady_iters or GPU_STEADY_ITERS[workload],
            preset="gpu",
            steady_in_first_call=True,
        )
        for mode in GPU_MODES
        for workload in GPU_WORKLOADS
    ]
    return [run for run in runs if run.strategies]


def plan_from_args(args: argparse.Namespace) -> BenchPlan:
    """Validate the command line into a :class:`BenchPlan`.

    :raises BenchError: naming the bad option and what is allowed.
    """
    if args.quick and args.preset not in (None, "quick"):
        raise BenchError(f"--quick with --preset {args.preset}: --quick means --preset quick")
    preset = "quick" if args.quick else (args.preset or "default")
    budget = args.budget_minutes
    if budget is not None and budget <= 0:
        raise BenchError(f"--budget-minutes {budget:g}: must be > 0")
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


# -- --dry-run ---------------------------------------------------------------------------------


@attrs.frozen
class PlannedCell:
    """One cell of the plan, where it stands in the execution order."""

    order: int
    """1-based position in the execution order."""
    step: Step
    cell: Cell

    @property
    def label(self) -> str:
        return f"{self.cell.label} ({self.step.context})"

    def command(self) -> list[str]:
        output = Path("SCRATCH") / self.cell.strategy / "result.json"
        return worker_command(
            self.step.settings, self.cell.depth, self.cell.batch, output,
            strategy=self.cell.strategy,
        )  # fmt: skip


def planned_cells(plan: BenchPlan) -> list[PlannedCell]:
    """Every cell of ``plan`` in the order it would run."""
    cells = [(step, cell) for step in plan.steps() for cell in step.settings.cells()]
    return [PlannedCell(index + 1, step, cell) for index, (step, cell) in enumerate(cells)]


def parameter_count(settings: BenchSettings, depth: int | None) -> int:
    """Parameters of ``settings.model`` at ``depth``, built on the meta device (shapes only,
    no memory, no initialisation)."""
    import torch

    from torchkiln.examples import BUILDS_ON_DEVICE, load_model

    kwargs: dict[str, object] = {} if depth is None else {"depth": depth}
    if settings.model.partition(":")[0] in BUILDS_ON_DEVICE:
        kwargs |= {"device": "meta", "dtype": settings.dtype}
        model = load_model(settings.model, **kwargs)
    else:
        with torch.device("meta"):
            model = load_model(settings.model, **kwargs)
    return sum(p.numel() for p in model.parameters())


def _parameters_line(plan: BenchPlan) -> str:
    depths = dict.fromkeys(d for run in plan.runs for d in run.depths)
    parts = []
    for depth in depths:
        where = "its own size" if depth is None else f"depth {depth}"
        try:
            count = parameter_count(plan.runs[0], depth)
        except Exception as error:  # a custom factory that cannot build on meta: say so
            parts.append(f"{where}: unknown ({type(error).__name__}: {error})")
        else:
            short = f"{count / 1e9:.2f}e9" if count >= 1e9 else f"{count / 1e6:.1f}e6"
            parts.append(f"{where}: {short} ({count:,})")
    return "parameters (built on the meta device): " + ", ".join(parts)


def _budget_line(plan: BenchPlan) -> str:
    if plan.budget_minutes is None:
        return "time budget: none (--budget-minutes)"
    return (
        f"time budget: {plan.budget_minutes:g} min: no cell starts after it, and the rest are "
        f"reported as skipped; a cell running then is stopped {BUDGET_GRACE_SECONDS:g} s "
        "past it"
    )


def _run_line(index: int, run: BenchSettings) -> str:
    depths = ", ".join("default" if d is None else str(d) for d in run.depths)
    batches = ", ".join(map(str, run.batches))
    return (
        f"  {index}. {run_context(run.workload, run.mode)}: "
        f"{', '.join(run.strategies)} at depths {depths}, batch {batches}, "
        f"{run.steady_iters} steady calls"
    )


def render_plan(plan: BenchPlan) -> str:
    """The dry run's report: settings, parameter counts, budget, outputs, runs, and every
    cell in execution order with its worker command."""
    first = plan.runs[0]
    steady = "in the first-call process" if first.steady_in_first_call else "in a shared process"
    warm = [s for s in first.strategies if first.runs_warm(s)]
    lines = [
        f"torchkiln bench --preset {plan.preset} --dry-run: nothing is run",
        f"model {first.model}, {first.dtype}, device {first.device}, backend {first.backend}, "
        f"seq {first.seq}, generate {first.new_tokens} new tokens, warm runs "
        f"{'for ' + ', '.join(warm) if warm else 'off'}, steady state timed {steady}",
        _parameters_line(plan),
        _budget_line(plan),
        f"outputs: JSON {plan.json_path or '(none: --json)'} (rewritten after every cell), "
        f"plot {plan.plot_path or '(none: --plot)'} (drawn at the end)",
        "",
        f"runs ({len(plan.runs)}):",
        *(_run_line(i + 1, run) for i, run in enumerate(plan.runs)),
        "",
    ]
    cells = planned_cells(plan)
    lines.append(f"cells in the order they run ({len(cells)}):")
    for planned in cells:
        lines.append(f"  [{planned.order}] {planned.label}")
        lines.append(f"      {shlex.join(planned.command())}")
    return "\n".join(lines)
