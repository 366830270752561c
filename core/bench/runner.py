"""Run every cell of a bench in fresh worker processes, cold then warm, and collect results.

Cold: a new process with a new, empty inductor cache directory. Warm: another new process
reusing the directory the cold run filled, so the difference is what the persistent compile
cache saves (see :mod:`torchkiln.artifacts.cache`). ``eager`` has nothing to cache and runs once.
Then, per depth and batch, one more process times the steady state of every strategy in
alternating rounds, with the caches those runs filled (so it compiles warm), so that every
strategy sees the same machine load. A worker that fails or times out is recorded on its
cell; the run goes on.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import attrs

from torchkiln.bench.progress import BenchProgress
from torchkiln.bench.results import CellResult, RunFailure
from torchkiln.bench.settings import BenchSettings, Cell
from torchkiln.bench.worker_process import run_worker, worker_command

BUDGET_GRACE_SECONDS = 45.0
"""A cell started before the time budget ran out may run this long past it, then it is
stopped (reported as timed out) so the whole bench ends soon after its budget."""
SKIPPED_BUDGET = "time budget"

Notify = Callable[[str, str | None], None]
"""``notify(phase, None)`` as a run starts, ``notify(phase, text)`` with what its worker says
it is doing (``""``: nothing new, a clock tick)."""


def run_cell(
    settings: BenchSettings, cell: Cell, scratch: Path, keep_cache: Path, notify: Notify
) -> CellResult:
    """The precompile run (``precompiled``: untimed, in a process and cache directory of its
    own), the cold run with a fresh cache directory, then (compiled strategies) the warm run.
    The cache the runs filled is merged into ``keep_cache`` for the steady-state run."""
    folder = scratch / cell.strategy
    output = folder / "result.json"
    folder.mkdir(parents=True, exist_ok=True)
    result = CellResult(cell)

    def run(phase: str, cache: str) -> tuple[dict[str, Any] | None, RunFailure | None]:
        notify(phase, None)
        command = worker_command(
            settings, cell.depth, cell.batch, output, strategy=cell.strategy,
            precompile=phase == "precompile", scratch=scratch,
        )  # fmt: skip
        said = lambda text: notify(phase, text)  # noqa: E731
        return run_worker(command, phase, folder / cache, output, settings.timeout, said)

    if cell.strategy == "precompiled":
        result.precompile, result.failure = run("precompile", "precompile-cache")
        if result.failure is not None:
            return result
    result.cold, result.failure = run("cold", "inductor-cache")
    if result.failure is None and settings.runs_warm(cell.strategy):
        result.warm, result.failure = run("warm", "inductor-cache")
    if (folder / "inductor-cache").exists():
        # Entries are keyed by content hash, so caches of several strategies merge safely.
        shutil.copytree(folder / "inductor-cache", keep_cache, dirs_exist_ok=True)
    return result


def run_steady(
    settings: BenchSettings,
    results: list[CellResult],
    scratch: Path,
    cache: Path,
    on_progress: Callable[[str], None],
) -> None:
    """Time every strategy of one depth and batch together; attach the samples to ``results``."""
    for result in results:
        if not result.ok:
            result.steady_failure = "not run: its first-call run failed"
    results = [r for r in results if r.ok]
    if not results:
        return
    strategies = tuple(r.cell.strategy for r in results)
    output = scratch / "steady.json"
    cell = results[0].cell
    command = worker_command(
        settings, cell.depth, cell.batch, output, steady=strategies, scratch=scratch
    )
    # Every strategy compiles once more in this process (warm caches), then the timed rounds.
    timeout = settings.timeout * len(strategies)
    data, failure = run_worker(command, "steady", cache, output, timeout, on_progress)
    for result in results:
        if data is None:
            result.steady_failure = failure.message if failure else "no result"
        elif result.cell.strategy in data["errors"]:
            result.steady_failure = data["errors"][result.cell.strategy]
        else:
            result.steady_samples = data["steady_seconds"][result.cell.strategy]


def count_steps(settings: BenchSettings) -> int:
    """Progress steps of one :func:`run_bench_cells` call: the cells, plus one shared
    steady-state run per depth and batch unless the first-call runs time it."""
    cells = settings.cells()
    groups = {(c.depth, c.batch) for c in cells}
    return len(cells) + sum(1 for depth, _ in groups if settings.times_steady(depth))


def _within_budget(settings: BenchSettings, deadline: float | None) -> BenchSettings | None:
    """``settings`` with the worker timeout cut to what the budget leaves (plus a grace), or
    ``None`` when the budget is spent and nothing may start."""
    if deadline is None:
        return settings
    left = deadline - time.monotonic()
    if left <= 0:
        return None
    return attrs.evolve(settings, timeout=min(settings.timeout, left + BUDGET_GRACE_SECONDS))


def run_bench_cells(
    settings: BenchSettings,
    *,
    cache_root: str | None = None,
    stream: TextIO | None = None,
    deadline: float | None = None,
    on_cell: Callable[[list[CellResult]], None] = lambda _results: None,
    progress: BenchProgress | None = None,
) -> list[CellResult]:
    """Run every cell (cold, warm), then each depth and batch's steady state; never raises for
    a failing cell.

    ``deadline`` (``time.monotonic()``): no cell starts after it; those cells are returned
    with ``skipped="time budget"``. ``on_cell`` gets this call's results so far after every
    finished or skipped cell, and again after each steady-state run (to save them).
    ``progress`` shares one step counter across several calls (it is then not finished here).
    """
    groups: dict[tuple[int | None, int], list[Cell]] = {}
    for cell in settings.cells():
        groups.setdefault((cell.depth, cell.batch), []).append(cell)
    shown = progress or BenchProgress(count_steps(settings), stream)
    root = Path(cache_root) if cache_root else Path(tempfile.mkdtemp(prefix="torchkiln-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    results: list[CellResult] = []
    try:
        for (depth, batch), members in groups.items():
            scratch = Path(tempfile.mkdtemp(prefix=f"d{depth}-b{batch}-", dir=root))
            merged = scratch / "merged-cache"
            group: list[CellResult] = []
            for cell in members:
                group.append(_cell(settings, cell, scratch, merged, shown, deadline))
                on_cell(results + group)
            if settings.times_steady(depth):
                _steady(settings, group, scratch, merged, shown, deadline)
                on_cell(results + group)  # now with the steady-state numbers
            results += group
            if not cache_root:
                shutil.rmtree(scratch, ignore_errors=True)
    finally:
        if not cache_root:
            shutil.rmtree(root, ignore_errors=True)
    if progress is None:
        shown.finish()
    return results


def _steady(
    settings: BenchSettings,
    results: list[CellResult],
    scratch: Path,
    merged: Path,
    progress: BenchProgress,
    deadline: float | None,
) -> None:
    """The shared steady-state run of one depth and batch, unless the budget is spent."""
    index = progress.next_step()
    allowed = _within_budget(settings, deadline)
    if allowed is None:
        for result in results:
            if result.ok:
                result.steady_failure = f"skipped: {SKIPPED_BUDGET}"
        return
    depth, batch = results[0].cell.depth, results[0].cell.batch
    label = f"{'' if depth is None else f'depth {depth} '}batch {batch}"
    if any(r.ok for r in results):
        progress.show(index, label, "steady-state")
    said = lambda text: progress.show(index, label, "steady-state", text)  # noqa: E731
    run_steady(allowed, results, scratch, merged, said)


def _cell(
    settings: BenchSettings,
    cell: Cell,
    scratch: Path,
    merged: Path,
    progress: BenchProgress,
    deadline: float | None,
) -> CellResult:
    """One cell, unless the budget is spent; a cell the budget cut short is skipped, not failed."""
    index = progress.next_step()
    allowed = _within_budget(settings, deadline)
    if allowed is None:
        progress.skipped(cell.label, SKIPPED_BUDGET)
        return CellResult(cell, skipped=SKIPPED_BUDGET)
    notify = lambda phase, said: progress.show(index, cell.label, phase, said)  # noqa: E731
    result = run_cell(allowed, cell, scratch, merged, notify)
    failure = result.failure
    timed_out = failure is not None and failure.returncode is None and result.cold is None
    if timed_out and allowed.timeout < settings.timeout:  # only because the budget cut it
        result.skipped = f"{SKIPPED_BUDGET} (stopped {BUDGET_GRACE_SECONDS:g} s past it)"
        result.failure = None
        progress.skipped(cell.label, result.skipped)
    elif failure is not None:
        progress.failed(cell.label, failure)
    elif settings.steady_in_first_call and result.cold is not None:
        result.steady_samples = result.cold.get("steady_seconds")
        if not result.steady_samples:
            result.steady_failure = "the first-call run timed no steady-state calls"
    if result.ok:
        progress.measured(cell.label, result)
    return result
