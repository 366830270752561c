"""Run every cell of a bench in fresh worker processes, cold then warm (docs/benchmarks.md,
"What is measured"), then per depth and batch one shared steady-state process with the caches
those runs filled, and collect the results. A worker that fails or times out is recorded on
its cell; the run goes on."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import attrs

from torchkiln.artifacts.cache import cache_dir_environment
from torchkiln.bench.progress import BenchProgress
from torchkiln.bench.results import CellResult, RunFailure
from torchkiln.bench.settings import BenchSettings, Cell
from torchkiln.bench.worker import PROGRESS_PREFIX

BUDGET_GRACE_SECONDS = 45.0
"""A cell started before the time budget ran out may run this long past it, then it is
stopped (reported as timed out) so the whole bench ends soon after its budget."""
SKIPPED_BUDGET = "time budget"

STDERR_TAIL_LINES = 25
TICK_SECONDS = 1.0
"""How often a live (terminal) progress line is redrawn while a worker is quiet."""


def worker_command(
    settings: BenchSettings,
    depth: int | None,
    batch: int,
    output: Path,
    *,
    strategy: str | None = None,
    steady: tuple[str, ...] = (),
    precompile: bool = False,
    scratch: Path | None = None,
) -> list[str]:
    """``python -m torchkiln.bench.worker`` for one first-call run (``strategy``), the shared
    steady-state run of several strategies (``steady``), or writing ``precompiled``'s artifact
    directory (``precompile``); with ``scratch``, the artifact directories its strategies use."""
    command = [
        sys.executable, "-m", "torchkiln.bench.worker",
        "--model", settings.model,
        "--batch", str(batch),
        "--seq", str(settings.seq),
        "--backend", settings.backend,
        "--device", settings.device,
        "--dtype", settings.dtype,
        "--steady-iters", str(settings.steady_iters),
        "--warmup", str(settings.warmup_iters),
        "--output", str(output),
        "--spawned-at", repr(time.time()),
    ]  # fmt: skip
    if precompile:
        command.append("--precompile")
    elif strategy:
        command += ["--strategy", strategy]
        if settings.steady_in_first_call:
            command.append("--steady-here")
    else:
        command += ["--strategies", ",".join(steady)]
    strategies = steady or (("precompiled",) if precompile else (strategy,))
    if scratch is not None:  # precompiled's artifacts, the form tiered's builder writes
        for name, option in (("precompiled", "--artifacts"), ("tiered", "--tiered-artifacts")):
            if name in strategies:
                command += [option, str(scratch / name / "artifacts")]
    if settings.mode is not None:
        command += ["--mode", settings.mode]
    if depth is not None:
        command += ["--depth", str(depth)]
    if settings.train:
        command.append("--train")
    if settings.workload == "generate":
        command += ["--workload", "generate", "--new-tokens", str(settings.new_tokens)]
    return command


def _tail(text: str) -> str:
    return "\n".join(text.strip().splitlines()[-STDERR_TAIL_LINES:])


def _stream(
    command: list[str], env: dict[str, str], timeout: float, on_progress: Callable[[str], None]
) -> tuple[int | None, str]:
    """Run ``command``; pass each progress line of its stderr to ``on_progress`` as it comes
    (``""`` every :data:`TICK_SECONDS` in between). Returns the exit code (``None``: stopped
    at ``timeout``) and the rest of stderr."""
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    kept: list[str] = []
    said: list[str] = []

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            if line.startswith(PROGRESS_PREFIX):
                said.append(line[len(PROGRESS_PREFIX) :].strip())
            else:
                kept.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    shown = 0
    try:
        while process.poll() is None and time.monotonic() < deadline:
            reader.join(TICK_SECONDS)
            new = said[shown:]
            shown += len(new)
            for text in [*new, ""]:
                on_progress(text)
    finally:  # also on Ctrl-C: never leave a worker behind
        timed_out = process.poll() is None
        if timed_out:
            process.kill()
        process.wait()
    reader.join(5.0)
    for text in said[shown:]:
        on_progress(text)
    return (None if timed_out else process.returncode), "".join(kept)


def run_worker(
    command: list[str],
    run: str,
    cache_dir: Path,
    output: Path,
    timeout: float,
    on_progress: Callable[[str], None] = lambda _text: None,
) -> tuple[dict[str, Any] | None, RunFailure | None]:
    """One worker process with ``cache_dir`` as its inductor cache; returns its JSON or why
    there is none. ``on_progress`` gets what the worker says it is doing."""
    output.unlink(missing_ok=True)
    env = dict(os.environ) | cache_dir_environment(cache_dir)
    code, stderr = _stream(command, env, timeout, on_progress)
    if code is None:
        return None, RunFailure(
            run, None, f"stopped after {timeout:.0f} s (--timeout)", _tail(stderr)
        )
    if code != 0 or not output.exists():
        last = _tail(stderr).splitlines()[-1:] or ["(no output)"]
        message = f"worker exited with code {code}: {last[0]}"
        return None, RunFailure(run, code, message, _tail(stderr))
    return json.loads(output.read_text(encoding="utf-8")), None


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


def _cell(
    settings: BenchSettings,
    cell: Cell,
    scratch: Path,
    keep_cache: Path,
    progress: BenchProgress,
    deadline: float | None,
) -> CellResult:
    """One cell, unless the budget is spent (then it is skipped, not failed): the precompile
    run (``precompiled``: untimed, in a process and cache directory of its own), the cold run
    with a fresh cache directory, then (compiled strategies) the warm run. The cache the runs
    filled is merged into ``keep_cache`` for the steady-state run."""
    index = progress.next_step()
    allowed = _within_budget(settings, deadline)
    if allowed is None:
        progress.skipped(cell.label, SKIPPED_BUDGET)
        return CellResult(cell, skipped=SKIPPED_BUDGET)
    folder = scratch / cell.strategy
    output = folder / "result.json"
    folder.mkdir(parents=True, exist_ok=True)
    result = CellResult(cell)

    def run(phase: str, cache: str) -> tuple[dict[str, Any] | None, RunFailure | None]:
        show = functools.partial(progress.show, index, cell.label, phase)
        show()
        command = worker_command(
            allowed, cell.depth, cell.batch, output, strategy=cell.strategy,
            precompile=phase == "precompile", scratch=scratch,
        )  # fmt: skip
        return run_worker(command, phase, folder / cache, output, allowed.timeout, show)

    if cell.strategy == "precompiled":
        result.precompile, result.failure = run("precompile", "precompile-cache")
    if result.failure is None:
        result.cold, result.failure = run("cold", "inductor-cache")
    if result.failure is None and allowed.runs_warm(cell.strategy):
        result.warm, result.failure = run("warm", "inductor-cache")
    if (folder / "inductor-cache").exists():
        # Entries are keyed by content hash, so caches of several strategies merge safely.
        shutil.copytree(folder / "inductor-cache", keep_cache, dirs_exist_ok=True)
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


def _steady(
    settings: BenchSettings,
    results: list[CellResult],
    scratch: Path,
    cache: Path,
    progress: BenchProgress,
    deadline: float | None,
) -> None:
    """The shared steady-state run of one depth and batch, unless the budget is spent: every
    strategy timed together; the samples are attached to ``results``."""
    index = progress.next_step()
    allowed = _within_budget(settings, deadline)
    for result in results:
        if result.ok and allowed is None:
            result.steady_failure = f"skipped: {SKIPPED_BUDGET}"
        elif not result.ok and allowed is not None:
            result.steady_failure = "not run: its first-call run failed"
    ran = [r for r in results if r.ok]
    if allowed is None or not ran:
        return
    cell = ran[0].cell
    label = f"{'' if cell.depth is None else f'depth {cell.depth} '}batch {cell.batch}"
    show = functools.partial(progress.show, index, label, "steady-state")
    show()
    strategies = tuple(r.cell.strategy for r in ran)
    output = scratch / "steady.json"
    command = worker_command(
        allowed, cell.depth, cell.batch, output, steady=strategies, scratch=scratch
    )
    # Every strategy compiles once more in this process (warm caches), then the timed rounds.
    timeout = allowed.timeout * len(strategies)
    data, failure = run_worker(command, "steady", cache, output, timeout, show)
    for result in ran:
        if data is None:
            result.steady_failure = failure.message if failure else "no result"
        elif result.cell.strategy in data["errors"]:
            result.steady_failure = data["errors"][result.cell.strategy]
        else:
            result.steady_samples = data["steady_seconds"][result.cell.strategy]
