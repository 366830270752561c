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

import os
import re
import shutil
import statistics
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
from torchkiln.bench.settings import BenchSettings, Cell
from torchkiln.bench.worker import PROGRESS_PREFIX

STDERR_TAIL_LINES = 25
BUDGET_GRACE_SECONDS = 45.0
"""A cell started before the time budget ran out may run this long past it, then it is
stopped (reported as timed out) so the whole bench ends soon after its budget."""
SKIPPED_BUDGET = "time budget"


@attrs.define
class RunFailure:
    """Why one worker run produced no result."""

    run: str
    """``cold`` or ``warm``."""
    returncode: int | None
    """``None`` when it was stopped for running past the timeout."""
    message: str
    stderr_tail: str

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.define
class CellResult:
    """One cell's measurements (the workers' JSON) or its failure."""

    cell: Cell
    cold: dict[str, Any] | None = None
    warm: dict[str, Any] | None = None
    failure: RunFailure | None = None
    steady_samples: list[float] | None = None
    """This strategy's timed calls in the shared steady-state run of its depth and batch."""
    steady_failure: str | None = None
    precompile: dict[str, Any] | None = None
    """``precompiled`` cells: the precompile run's JSON (seconds, entries, skipped)."""
    skipped: str | None = None
    """Why the cell was not started (``time budget``); it has no numbers and no failure."""

    @property
    def ok(self) -> bool:
        return self.failure is None and self.cold is not None

    @property
    def cold_first_call(self) -> float | None:
        return self.cold["first_call_seconds"] if self.cold else None

    @property
    def warm_first_call(self) -> float | None:
        return self.warm["first_call_seconds"] if self.warm else None

    @property
    def steady(self) -> float | None:
        """Median steady-state call time (from the shared steady-state run)."""
        return statistics.median(self.steady_samples) if self.steady_samples else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "depth": self.cell.depth,
            "batch": self.cell.batch,
            "strategy": self.cell.strategy,
            "cold_first_call_seconds": self.cold_first_call,
            "warm_first_call_seconds": self.warm_first_call,
            "steady_median_seconds": self.steady,
            "steady_min_seconds": min(self.steady_samples) if self.steady_samples else None,
            "steady_seconds": self.steady_samples,
            "steady_failure": self.steady_failure,
            "cold": self.cold,
            "warm": self.warm,
            "failure": self.failure.to_dict() if self.failure else None,
            "precompile": self.precompile,
            "skipped": self.skipped,
        }


def worker_command(
    settings: BenchSettings,
    depth: int | None,
    batch: int,
    output: Path,
    *,
    strategy: str | None = None,
    steady: tuple[str, ...] = (),
    artifacts: Path | None = None,
    precompile: bool = False,
    tiered_artifacts: Path | None = None,
) -> list[str]:
    """``python -m torchkiln.bench.worker`` for one first-call run (``strategy``), for the
    shared steady-state run of several strategies (``steady``), or for writing the artifact
    directory (``precompile``); ``artifacts`` is the directory the precompiled strategy uses,
    ``tiered_artifacts`` the one the tiered strategy's builder writes (and the steady-state
    run loads: the same whole-model form the first-call run switched to, without building it
    a second time)."""
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
        command += ["--precompile"]
    elif strategy:
        command += ["--strategy", strategy]
        if settings.steady_in_first_call:
            command.append("--steady-here")
    else:
        command += ["--strategies", ",".join(steady)]
    if artifacts is not None:
        command += ["--artifacts", str(artifacts)]
    if tiered_artifacts is not None:
        command += ["--tiered-artifacts", str(tiered_artifacts)]
    if settings.mode is not None:
        command += ["--mode", settings.mode]
    if settings.dispatch is not None:
        command += ["--dispatch", settings.dispatch]
    if depth is not None:
        command += ["--depth", str(depth)]
    if settings.train:
        command.append("--train")
    if settings.workload == "generate":
        command += ["--workload", "generate", "--new-tokens", str(settings.new_tokens)]
    return command


def _tail(text: str) -> str:
    return "\n".join(text.strip().splitlines()[-STDERR_TAIL_LINES:])


COUNTED = re.compile(r"(?P<done>\d+)/(?P<total>\d+)( \w+)?$")
"""Counted work in a worker's progress line: ``steady 7/10`` or ``steady 7/10 rounds``."""
LOG_EVERY_SECONDS = 10.0
"""A log (not a terminal) gets counted progress at most this often, and at its end."""
TICK_SECONDS = 1.0
"""How often a live (terminal) progress line is redrawn while a worker is quiet."""


def _stream_worker(
    command: list[str],
    env: dict[str, str],
    timeout: float,
    on_progress: Callable[[str], None],
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
    timed_out = False
    try:
        while process.poll() is None:
            if time.monotonic() >= deadline:
                timed_out = True
                break
            reader.join(TICK_SECONDS)
            while shown < len(said):
                on_progress(said[shown])
                shown += 1
            on_progress("")
    finally:  # also on Ctrl-C: never leave a worker behind
        if process.poll() is None:
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
    on_progress: Callable[[str], None] | None = None,
) -> tuple[dict[str, Any] | None, RunFailure | None]:
    """One worker process; returns its JSON or why there is none. ``on_progress`` gets what
    the worker says it is doing (:func:`torchkiln.bench.worker.progress`)."""
    import json

    output.unlink(missing_ok=True)
    env = dict(os.environ) | cache_dir_environment(cache_dir)
    code, stderr = _stream_worker(command, env, timeout, on_progress or (lambda _text: None))
    if code is None:
        return None, RunFailure(
            run, None, f"stopped after {timeout:.0f} s (--timeout)", _tail(stderr)
        )
    if code != 0 or not output.exists():
        last = _tail(stderr).splitlines()[-1:] or ["(no output)"]
        message = f"worker exited with code {code}: {last[0]}"
        return None, RunFailure(run, code, message, _tail(stderr))
    return json.loads(output.read_text(encoding="utf-8")), None


def run_cell(
    settings: BenchSettings,
    cell: Cell,
    scratch: Path,
    keep_cache: Path,
    notify: Callable[[str, str | None], None],
) -> CellResult:
    """Cold run with a fresh cache directory, then (compiled strategies) the warm run.

    The cache the runs filled is merged into ``keep_cache`` for the steady-state run.
    ``notify(phase, None)`` is called as each run starts, ``notify(phase, text)`` with what its
    worker says it is doing (``""``: nothing new, a clock tick).
    """
    cache_dir = scratch / cell.strategy / "inductor-cache"
    output = scratch / cell.strategy / "result.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    result = CellResult(cell)

    artifacts = artifacts_dir(scratch) if cell.strategy == "precompiled" else None
    tiered = tiered_artifacts_dir(scratch) if cell.strategy == "tiered" else None

    def run(phase: str) -> tuple[dict[str, Any] | None, RunFailure | None]:
        notify(phase, None)
        command = worker_command(
            settings, cell.depth, cell.batch, output, strategy=cell.strategy,
            artifacts=artifacts, tiered_artifacts=tiered,
        )  # fmt: skip
        said = lambda text: notify(phase, text)  # noqa: E731
        return run_worker(command, phase, cache_dir, output, settings.timeout, said)

    if artifacts is not None:
        # Written once, untimed, in a process and cache directory of its own; the cold run
        # then starts from an empty cache directory and the artifacts alone.
        notify("precompile", None)
        command = worker_command(
            settings, cell.depth, cell.batch, output, artifacts=artifacts, precompile=True
        )
        precompile_cache = scratch / cell.strategy / "precompile-cache"
        result.precompile, result.failure = run_worker(
            command, "precompile", precompile_cache, output, settings.timeout,
            lambda text: notify("precompile", text),
        )  # fmt: skip
        if result.failure is not None:
            return result
    result.cold, result.failure = run("cold")
    if result.failure is None and settings.runs_warm(cell.strategy):
        result.warm, result.failure = run("warm")
    if cache_dir.exists():
        # Entries are keyed by content hash, so caches of several strategies merge safely.
        shutil.copytree(cache_dir, keep_cache, dirs_exist_ok=True)
    return result


def artifacts_dir(scratch: Path) -> Path:
    """Where the precompiled strategy's artifacts of one depth and batch live."""
    return scratch / "precompiled" / "artifacts"


def tiered_artifacts_dir(scratch: Path) -> Path:
    """Where the tiered strategy's builder writes the whole-model form of one depth and batch
    (empty when its first-call run starts: that run is cold)."""
    return scratch / "tiered" / "artifacts"


def run_steady(
    settings: BenchSettings,
    results: list[CellResult],
    scratch: Path,
    cache: Path,
    on_progress: Callable[[str], None] | None = None,
) -> None:
    """Time every strategy of one depth and batch together; attach the samples to ``results``."""
    depth, batch = results[0].cell.depth, results[0].cell.batch
    for result in results:
        if not result.ok:
            result.steady_failure = "not run: its first-call run failed"
    results = [r for r in results if r.ok]
    if not results:
        return
    strategies = tuple(r.cell.strategy for r in results)
    output = scratch / "steady.json"
    artifacts = artifacts_dir(scratch) if "precompiled" in strategies else None
    tiered = tiered_artifacts_dir(scratch) if "tiered" in strategies else None
    command = worker_command(
        settings, depth, batch, output, steady=strategies, artifacts=artifacts,
        tiered_artifacts=tiered,
    )  # fmt: skip
    # Every strategy compiles once more in this process (warm caches), then the timed rounds.
    timeout = settings.timeout * max(1, len(strategies))
    data, failure = run_worker(command, "steady", cache, output, timeout, on_progress)
    for result in results:
        if data is None:
            result.steady_failure = failure.message if failure else "no result"
        elif result.cell.strategy in data["errors"]:
            result.steady_failure = data["errors"][result.cell.strategy]
        else:
            result.steady_samples = data["steady_seconds"][result.cell.strategy]


class BenchProgress:
    """``[3/10] depth 16 batch 1 regional: cold run (2 m 10 s elapsed)`` on ``stream``.

    One progress can span several :func:`run_bench_cells` calls (a preset's runs): each call
    numbers its steps from ``done`` on and advances it, and ``context`` (``forward, mode
    default``) tells the runs apart. After each cell, one line says what it measured, so a
    log of a run that was stopped still has the numbers."""

    def __init__(self, total: int, stream: TextIO | None = None):
        self.total = total
        self.done = 0
        self.context = ""
        self.stream = stream if stream is not None else sys.stderr
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self.started = time.perf_counter()
        self._run_started = self._logged = self.started
        self._said = ""

    def show(self, index: int, label: str, phase: str, said: str | None = None) -> None:
        """A run starts (``said`` is ``None``), or its worker said what it is doing now
        (``said``; ``""``: nothing new). A terminal gets one line, redrawn every second; a log
        gets a line per start and per thing said, counted work (``steady 7/10``) at most
        every :data:`LOG_EVERY_SECONDS` and at its end."""
        now = time.perf_counter()
        if said is None:
            self._run_started, self._said = now, ""
        elif said:
            self._said = said
        if not self.live and not self._log_now(said, now):
            return
        where = f"[{index + 1}/{self.total}] {self._where(label)}: {phase} run"
        if said is None or self.live:
            doing = f": {self._said} ({int(now - self._run_started)} s)" if self._said else ""
            text = (
                f"{where}{doing} ({_minutes(now - self.started)} elapsed, "
                f"{self.total - index - 1} more to go)"
            )
        else:
            text = f"    {where}: {said} ({int(now - self._run_started)} s)"
        self._logged = now
        if self.live:
            self.stream.write("\r\x1b[K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def _log_now(self, said: str | None, now: float) -> bool:
        if said is None:
            return True
        if not said:
            return False
        counted = COUNTED.search(said)
        if counted is None or counted["done"] == counted["total"]:
            return True
        return now - self._logged >= LOG_EVERY_SECONDS

    def _where(self, label: str) -> str:
        return f"{label} ({self.context})" if self.context else label

    def _line(self, text: str) -> None:
        prefix = "\r\x1b[K" if self.live else ""
        self.stream.write(f"{prefix}{text}\n")
        self.stream.flush()

    def failed(self, label: str, failure: RunFailure) -> None:
        self._line(f"{self._where(label)}: {failure.run} run failed: {failure.message}")

    def measured(self, label: str, result: CellResult) -> None:
        steady = "" if result.steady is None else f", steady {result.steady * 1000:.2f} ms"
        first = result.cold_first_call
        first_text = "-" if first is None else f"{first:.2f} s"
        self._line(f"{self._where(label)}: first call {first_text}{steady}")

    def skipped(self, label: str, why: str) -> None:
        self._line(f"{self._where(label)}: skipped ({why})")

    def finish(self) -> None:
        if self.live:
            self.stream.write("\r\x1b[K")
        self.stream.write(
            f"bench finished: {self.total} steps in {_minutes(time.perf_counter() - self.started)}\n"
        )
        self.stream.flush()


def _minutes(seconds: float) -> str:
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes} m {rest:02d} s" if minutes else f"{rest} s"


def count_steps(settings: BenchSettings) -> int:
    """Progress steps of one :func:`run_bench_cells` call: the cells, plus one shared
    steady-state run per depth and batch unless the first-call runs time it."""
    cells = settings.cells()
    groups = {(c.depth, c.batch) for c in cells}
    return len(cells) + sum(1 for depth, _ in groups if settings.times_steady(depth))


def _budget_left(deadline: float | None) -> float | None:
    return None if deadline is None else deadline - time.monotonic()


def _cell_settings(settings: BenchSettings, deadline: float | None) -> BenchSettings | None:
    """``settings`` with the worker timeout cut to what the budget leaves (plus a grace), or
    ``None`` when the budget is spent and the cell must not start."""
    left = _budget_left(deadline)
    if left is None:
        return settings
    if left <= 0:
        return None
    return attrs.evolve(settings, timeout=min(settings.timeout, left + BUDGET_GRACE_SECONDS))


def run_bench_cells(
    settings: BenchSettings,
    *,
    cache_root: str | None = None,
    stream: TextIO | None = None,
    deadline: float | None = None,
    on_cell: Callable[[list[CellResult]], None] | None = None,
    progress: BenchProgress | None = None,
) -> list[CellResult]:
    """Run every cell (cold, warm), then each depth and batch's steady state; never raises for
    a failing cell.

    ``deadline`` (``time.monotonic()``): no cell starts after it; those cells are returned
    with ``skipped="time budget"``. ``on_cell`` gets this call's results so far after every
    finished or skipped cell, and again after each steady-state run (to save them). ``progress`` shares one step counter
    across several calls (it is then not finished here).
    """
    cells = settings.cells()
    groups: dict[tuple[int | None, int], list[Cell]] = {}
    for cell in cells:
        groups.setdefault((cell.depth, cell.batch), []).append(cell)
    own_progress = progress is None
    if progress is None:
        progress = BenchProgress(count_steps(settings), stream)
    root = Path(cache_root) if cache_root else Path(tempfile.mkdtemp(prefix="torchkiln-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    results: list[CellResult] = []
    try:
        for (depth, batch), members in groups.items():
            scratch = Path(tempfile.mkdtemp(prefix=f"d{depth}-b{batch}-", dir=root))
            merged = scratch / "merged-cache"
            group_results: list[CellResult] = []
            for cell in members:
                group_results.append(
                    _run_or_skip(settings, cell, scratch, merged, progress, deadline)
                )
                if on_cell is not None:
                    on_cell(results + group_results)
            if settings.times_steady(depth):
                _steady_or_skip(settings, group_results, scratch, merged, progress, deadline)
                if on_cell is not None:
                    on_cell(results + group_results)  # now with the steady-state numbers
            results += group_results
            if not cache_root:
                shutil.rmtree(scratch, ignore_errors=True)
    finally:
        if not cache_root:
            shutil.rmtree(root, ignore_errors=True)
    if own_progress:
        progress.finish()
    return results


def _steady_or_skip(
    settings: BenchSettings,
    results: list[CellResult],
    scratch: Path,
    merged: Path,
    progress: BenchProgress,
    deadline: float | None,
) -> None:
    """The shared steady-state run of one depth and batch, unless the budget is spent."""
    index = progress.done
    progress.done += 1
    steady_settings = _cell_settings(settings, deadline)
    if steady_settings is None:
        for result in results:
            if result.ok:
                result.steady_failure = f"skipped: {SKIPPED_BUDGET}"
        return
    if any(r.ok for r in results):
        depth, batch = results[0].cell.depth, results[0].cell.batch
        label = f"{'' if depth is None else f'depth {depth} '}batch {batch}"
        progress.show(index, label, "steady-state")
    said = lambda text: progress.show(index, label, "steady-state", text)  # noqa: E731
    run_steady(steady_settings, results, scratch, merged, said)


def _stopped_by_budget(result: CellResult, ran: BenchSettings, asked: BenchSettings) -> bool:
    """Whether the cell's first-call run timed out only because the budget cut its timeout."""
    failure = result.failure
    return (
        failure is not None
        and failure.returncode is None
        and result.cold is None
        and ran.timeout < asked.timeout
    )


def _run_or_skip(
    settings: BenchSettings,
    cell: Cell,
    scratch: Path,
    merged: Path,
    progress: BenchProgress,
    deadline: float | None,
) -> CellResult:
    index = progress.done
    progress.done += 1
    cell_settings = _cell_settings(settings, deadline)
    if cell_settings is None:
        progress.skipped(cell.label, SKIPPED_BUDGET)
        return CellResult(cell, skipped=SKIPPED_BUDGET)
    notify = lambda phase, said: progress.show(index, cell.label, phase, said)  # noqa: E731
    result = run_cell(cell_settings, cell, scratch, merged, notify)
    if _stopped_by_budget(result, cell_settings, settings):
        # Started in time but cut short by the budget: not a failure of the strategy.
        result.skipped = f"{SKIPPED_BUDGET} (stopped {BUDGET_GRACE_SECONDS:g} s past it)"
        result.failure = None
        progress.skipped(cell.label, result.skipped)
    elif result.failure is not None:
        progress.failed(cell.label, result.failure)
    elif settings.steady_in_first_call and result.cold is not None:
        result.steady_samples = result.cold.get("steady_seconds")
        if not result.steady_samples:
            result.steady_failure = "the first-call run timed no steady-state calls"
    if result.ok:
        progress.measured(cell.label, result)
    return result
