"""Run a :class:`BenchPlan`: its steps in order under the time budget, the JSON rewritten
after every cell, then the tables, the targets and the plot; or (``--from-json FILE``) the
tables, targets and plot of a run already written, also one stopped before its end."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from torchkiln.bench.plan import BenchPlan, render_plan, run_context
from torchkiln.bench.results import collect_environment, write_result
from torchkiln.bench.runner import BenchProgress, CellResult, count_steps, run_bench_cells
from torchkiln.bench.settings import EXIT_TARGET_MISSED, BenchError, check_device
from torchkiln.bench.table import render_all
from torchkiln.bench.targets import Target, check_targets, missed

JSON_FORMAT_VERSION = 1

Runs = list[tuple[dict[str, Any], list[CellResult]]]
"""Every run of a plan: its settings (as in the JSON document) and its results."""


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
    runs = [
        {
            "settings": settings.to_dict(),
            "cells": [r.to_dict() for r in run],
            "targets": [t.to_dict() for t in check_targets(run, settings.workload)],
        }
        for settings, run in zip(plan.runs, results, strict=True)
    ]
    return document | (runs[0] if len(runs) == 1 else {"runs": runs})


def _context(settings: dict[str, Any]) -> str:
    return run_context(settings["workload"], settings.get("mode"))


def _print_runs(runs: Runs, environment: dict[str, Any]) -> list[Target]:
    """Print every run's tables and targets (each titled, when there are several); return
    every target."""
    judged: list[Target] = []
    for settings, results in runs:
        targets = check_targets(results, settings.get("workload", "forward"))
        judged += targets
        title = f"=== {_context(settings)} ===\n" if len(runs) > 1 else ""
        print(title + render_all(settings, environment, results, targets))
        print()
    return judged


def _exit_status(runs: Runs, targets: list[Target], check: bool) -> int:
    """1 when a cell failed; else, with ``check``, 3 when a target is NOT met; else 0."""
    if any(r.failure is not None for _, results in runs for r in results):
        return 1
    return EXIT_TARGET_MISSED if check and missed(targets) else 0


def run_plan(plan: BenchPlan, args: argparse.Namespace) -> int:
    """Execute ``plan`` (``--dry-run``: print it instead); 0 when every cell that ran produced
    numbers (cells skipped for the time budget do not count as failures), else 1; with
    ``--check``, 3 when a target is NOT met; 130 when interrupted (Ctrl-C, SIGINT), after
    printing and saving the cells that finished."""
    if getattr(args, "dry_run", False):
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
    runs = [(s.to_dict(), r) for s, r in zip(plan.runs, execution.results, strict=True)]
    targets = execution.report(runs, interrupted)
    if plan.plot_path is not None:
        first = plan.runs[0]
        title = f"torchkiln bench: {first.model}, backend {first.backend}"
        if len(runs) > 1:
            title = (
                f"torchkiln bench --preset {plan.preset}: {first.model}, {first.dtype}, "
                f"backend {first.backend}"
            )
        _plot(runs, plan.plot_path, title)
    if interrupted:
        return 130
    return _exit_status(runs, targets, bool(getattr(args, "check", False)))


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
        budget = self.plan.budget_minutes
        deadline = None if budget is None else time.monotonic() + budget * 60.0
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

    def report(self, runs: Runs, interrupted: bool) -> list[Target]:
        """Print every run's table and targets, save the final JSON; return every target."""
        wall = time.perf_counter() - self.started
        judged = _print_runs(runs, self.environment)
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
        return judged


def _plot(runs: Runs, path: str, title: str, *, rows: bool = False) -> None:
    """One run: two panels; several (or ``rows``): a row of panels per run."""
    from torchkiln.bench.plot import write_plot, write_runs_plot

    if len(runs) == 1 and not rows:
        write_plot(runs[0][1], path, title)
    else:
        write_runs_plot([(_context(s), results) for s, results in runs], path, title)
    print(f"wrote {path}")


def load_runs(path: str | Path) -> tuple[dict[str, Any], Runs]:
    """The document and its runs, each ``(settings, results)``.

    :raises BenchError: when the file is missing or is not a bench JSON document.
    """
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise BenchError(
            f"--from-json {path}: cannot read a bench JSON document: {error}"
        ) from error
    if not isinstance(document, dict) or "torchkiln_bench" not in document:
        raise BenchError(f"--from-json {path}: not written by torchkiln bench --json")
    runs = document.get("runs") or [document]
    return document, [
        (run["settings"], [CellResult.from_dict(c) for c in run["cells"]]) for run in runs
    ]


def replay(path: str, plot_path: str | None, *, check: bool = False) -> int:
    """Print the tables and targets of ``path``; draw ``plot_path`` when given. 0 unless a
    cell in it failed (1), or, with ``check``, a target is NOT met (3)."""
    document, runs = load_runs(path)
    targets = _print_runs(runs, document.get("environment", {}))
    if not document.get("complete", True):
        print(f"{path}: the run stopped before its end; these are the cells it finished")
    if plot_path:
        first = runs[0][0]
        model = f"{first['model']}, {first.get('dtype', 'float32')}"
        _plot(runs, plot_path, f"torchkiln bench: {model}, backend {first['backend']}", rows=True)
    return _exit_status(runs, targets, check)
