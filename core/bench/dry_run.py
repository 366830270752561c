"""``torchkiln bench --dry-run``: the plan in words, nothing run (works without a GPU).

The model's parameter count comes from building it on the meta device: shapes only, no
memory, no initialisation.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import attrs

from torchkiln.bench.plan import BenchPlan
from torchkiln.bench.presets import Step, mode_name
from torchkiln.bench.runner import BUDGET_GRACE_SECONDS
from torchkiln.bench.settings import BenchSettings, Cell
from torchkiln.bench.worker_process import worker_command


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
    """Parameters of ``settings.model`` at ``depth``, built on the meta device."""
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
    first = plan.runs[0]
    depths = dict.fromkeys(d for run in plan.runs for d in run.depths)
    parts = []
    for depth in depths:
        where = "its own size" if depth is None else f"depth {depth}"
        try:
            count = parameter_count(first, depth)
        except Exception as error:  # a custom factory that cannot build on meta: say so
            parts.append(f"{where}: unknown ({type(error).__name__}: {error})")
        else:
            parts.append(f"{where}: {_short(count)} ({count:,})")
    return "parameters (built on the meta device): " + ", ".join(parts)


def _short(count: int) -> str:
    return f"{count / 1e9:.2f}e9" if count >= 1e9 else f"{count / 1e6:.1f}e6"


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
        f"  {index}. {run.workload}, mode {mode_name(run.mode)}: "
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
