"""Run a :class:`BenchPlan`: its steps in order under the time budget, the JSON rewritten
after every cell, then the tables, the targets and the plot."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from torchkiln.bench.environment import collect_environment
from torchkiln.bench.plan import BenchPlan
from torchkiln.bench.presets import mode_name
from torchkiln.bench.replay import exit_status
from torchkiln.bench.results import write_result
from torchkiln.bench.runner import BenchProgress, CellResult, count_steps, run_bench_cells
from torchkiln.bench.settings import BenchSettings, check_device
from torchkiln.bench.table import render_all
from torchkiln.bench.targets import Target, check_targets

JSON_FORMAT_VERSION = 1


def _run_document(settings: BenchSettings, results: list[CellResult]) -> dict[str, Any]:
    return {
        "settings": settings.to_dict(),
        "cells": [r.to_dict() for r in results],
        "targets": [t.to_dict() for t in check_targets(results, settings.workload)],
    }


def bench_document(
    plan: BenchPlan,
    environment: dict[str, Any],
    results: list[list[CellResult]],
    wall: float,
    complete: bool,
) -> dict[str, Any]:
    """The JSON document: one run's ``settings``/``cells``/``targets`` at the top level, or a
    ``runs`` list of them for a plan of several runs (the gpu preset)."""
    document: dict[str, Any] = {
        "torchkiln_bench": JSON_FORMAT_VERSION,
        "preset": plan.preset,
        "budget_minutes": plan.budget_minutes,
        "complete": complete,
        "environment": environment,
        "wall_seconds": wall,
    }
    runs = [_run_document(s, r) for s, r in zip(plan.runs, results, strict=True)]
    if len(runs) == 1:
        return document | runs[0]
    return document | {"runs": runs}


def _title(plan: BenchPlan, settings: BenchSettings) -> str:
    if len(plan.runs) == 1:
        return ""
    return f"=== {settings.workload}, mode {mode_name(settings.mode)} ===\n"


def run_plan(plan: BenchPlan, args: argparse.Namespace) -> int:
    """Execute ``plan`` (``--dry-run``: print it instead); 0 when every cell that ran produced
    numbers (cells skipped for the time budget do not count as failures), else 1; with
    ``--check``, 3 when a target is NOT met; 130 when interrupted (Ctrl-C, SIGINT), after
    printing and saving the cells that finished."""
    if getattr(args, "dry_run", False):
        from torchkiln.bench.dry_run import render_plan

        print(render_plan(plan))
        return 0
    for settings in plan.runs:
        check_device(settings.device)
    if plan.plot_path:
        from torchkiln.bench.plot import require_matplotlib

        require_matplotlib()
    execution = _Execution(plan, collect_environment(plan.runs[0].device))
    interrupted = False
    try:
        execution.run(args.cache_root)
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: the tables below hold the cells that finished", file=sys.stderr)
    every, targets = execution.report(interrupted)
    if plan.plot_path is not None:
        _plot(plan, execution.results, plan.plot_path)
    if interrupted:
        return 130
    failed = any(r.failure is not None for r in every)
    return exit_status(failed, targets, bool(getattr(args, "check", False)))


class _Execution:
    """The results of a plan as it runs, saved after every cell."""

    def __init__(self, plan: BenchPlan, environment: dict[str, Any]):
        self.plan = plan
        self.environment = environment
        self.results: list[list[CellResult]] = [[] for _ in plan.runs]
        self.started = time.perf_counter()

    def save(self, complete: bool) -> None:
        if self.plan.json_path:
            wall = time.perf_counter() - self.started
            document = bench_document(self.plan, self.environment, self.results, wall, complete)
            write_result(Path(self.plan.json_path), document)

    def run(self, cache_root: str | None) -> None:
        steps = self.plan.steps()
        progress = BenchProgress(sum(count_steps(step.settings) for step in steps))
        budget = self.plan.budget_seconds
        deadline = None if budget is None else time.monotonic() + budget
        for step in steps:
            before = list(self.results[step.run])
            progress.context = step.context if len(self.plan.runs) > 1 else ""

            def on_cell(partial: list[CellResult], run: int = step.run, done=before) -> None:
                self.results[run] = done + partial
                self.save(complete=False)

            self.results[step.run] = before + run_bench_cells(
                step.settings, cache_root=cache_root, deadline=deadline,
                on_cell=on_cell, progress=progress,
            )  # fmt: skip
        progress.finish()

    def report(self, interrupted: bool) -> tuple[list[CellResult], list[Target]]:
        """Print every run's table and targets, save the final JSON; return every cell and
        every target."""
        wall = time.perf_counter() - self.started
        judged: list[Target] = []
        for settings, run_results in zip(self.plan.runs, self.results, strict=True):
            targets = check_targets(run_results, settings.workload)
            judged += targets
            rendered = render_all(settings.to_dict(), self.environment, run_results, targets)
            print(_title(self.plan, settings) + rendered)
            print()
        every = [r for run_results in self.results for r in run_results]
        skipped = sum(1 for r in every if r.skipped)
        note = (
            f", {skipped} skipped (time budget {self.plan.budget_minutes:g} min)" if skipped else ""
        )
        stop = ", then interrupted" if interrupted else ""
        print(f"{len(every) - skipped} cells in {wall / 60:.1f} min{note}{stop}")
        self.save(complete=not interrupted)
        if self.plan.json_path:
            print(f"wrote {self.plan.json_path}")
        return every, judged


def _plot(plan: BenchPlan, results: list[list[CellResult]], path: str) -> None:
    from torchkiln.bench.plot import write_plot, write_runs_plot

    first = plan.runs[0]
    if len(plan.runs) == 1:
        write_plot(results[0], path, f"torchkiln bench: {first.model}, backend {first.backend}")
    else:
        panels = [
            (f"{s.workload}, mode {mode_name(s.mode)}", r)
            for s, r in zip(plan.runs, results, strict=True)
        ]
        write_runs_plot(
            panels, path,
            f"torchkiln bench --preset {plan.preset}: {first.model}, {first.dtype}, "
            f"backend {first.backend}",
        )  # fmt: skip
    print(f"wrote {path}")
