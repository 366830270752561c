"""Run every cell of a bench in fresh worker processes, cold then warm, and collect results.

Cold: a new process with a new, empty inductor cache directory. Warm: another new process
reusing the directory the cold run filled, so the difference is what the persistent compile
cache saves (see :mod:`torchkiln.cache`). ``eager`` has nothing to cache and runs once.
A worker that fails or times out is recorded on its cell; the run goes on.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import attrs

from torchkiln.bench.settings import COMPILED_STRATEGIES, BenchSettings, Cell
from torchkiln.cache import cache_dir_environment

STDERR_TAIL_LINES = 25


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
        """Median steady-state call time over the cold and warm runs' samples."""
        samples = [s for run in (self.cold, self.warm) if run for s in run["steady_seconds"]]
        return statistics.median(samples) if samples else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "depth": self.cell.depth,
            "batch": self.cell.batch,
            "strategy": self.cell.strategy,
            "cold_first_call_seconds": self.cold_first_call,
            "warm_first_call_seconds": self.warm_first_call,
            "steady_median_seconds": self.steady,
            "cold": self.cold,
            "warm": self.warm,
            "failure": self.failure.to_dict() if self.failure else None,
        }


def worker_command(settings: BenchSettings, cell: Cell, output: Path) -> list[str]:
    command = [
        sys.executable, "-m", "torchkiln.bench.worker",
        "--model", settings.model,
        "--batch", str(cell.batch),
        "--seq", str(settings.seq),
        "--strategy", cell.strategy,
        "--backend", settings.backend,
        "--device", settings.device,
        "--steady-iters", str(settings.steady_iters),
        "--warmup", str(settings.warmup_iters),
        "--output", str(output),
        "--spawned-at", repr(time.time()),
    ]  # fmt: skip
    if cell.depth is not None:
        command += ["--depth", str(cell.depth)]
    if settings.train:
        command.append("--train")
    return command


def _tail(text: str) -> str:
    return "\n".join(text.strip().splitlines()[-STDERR_TAIL_LINES:])


def run_worker(
    settings: BenchSettings, cell: Cell, run: str, cache_dir: Path, scratch: Path
) -> tuple[dict[str, Any] | None, RunFailure | None]:
    """One worker process; returns its JSON or why there is none."""
    import json

    output = scratch / f"{run}.json"
    output.unlink(missing_ok=True)
    env = dict(os.environ) | cache_dir_environment(cache_dir)
    try:
        finished = subprocess.run(
            worker_command(settings, cell, output), env=env, capture_output=True, text=True,
            timeout=settings.timeout, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired as expired:
        stderr = (
            expired.stderr.decode() if isinstance(expired.stderr, bytes) else expired.stderr or ""
        )
        message = f"stopped after {settings.timeout:.0f} s (--timeout)"
        return None, RunFailure(run, None, message, _tail(stderr))
    if finished.returncode != 0 or not output.exists():
        last = _tail(finished.stderr).splitlines()[-1:] or ["(no output)"]
        message = f"worker exited with code {finished.returncode}: {last[0]}"
        return None, RunFailure(run, finished.returncode, message, _tail(finished.stderr))
    return json.loads(output.read_text(encoding="utf-8")), None


def run_cell(
    settings: BenchSettings, cell: Cell, cache_root: Path, notify: Callable[[str], None]
) -> CellResult:
    """Cold run with a fresh cache directory, then (compiled strategies) the warm run."""
    scratch = Path(tempfile.mkdtemp(prefix="cell-", dir=cache_root))
    cache_dir = scratch / "inductor-cache"
    result = CellResult(cell)
    try:
        notify("cold")
        result.cold, result.failure = run_worker(settings, cell, "cold", cache_dir, scratch)
        if result.failure is None and settings.warm and cell.strategy in COMPILED_STRATEGIES:
            notify("warm")
            result.warm, result.failure = run_worker(settings, cell, "warm", cache_dir, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return result


class BenchProgress:
    """``[3/10] depth 16 batch 1 regional: cold run (2 m 10 s elapsed)`` on ``stream``."""

    def __init__(self, total: int, stream: TextIO | None = None):
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self.started = time.perf_counter()

    def show(self, index: int, cell: Cell, phase: str) -> None:
        elapsed = time.perf_counter() - self.started
        remaining = self.total - index
        text = (
            f"[{index + 1}/{self.total}] {cell.label}: {phase} run "
            f"({_minutes(elapsed)} elapsed, {remaining - 1} more to go)"
        )
        if self.live:
            self.stream.write("\r\x1b[K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def failed(self, cell: Cell, failure: RunFailure) -> None:
        prefix = "\r\x1b[K" if self.live else ""
        self.stream.write(f"{prefix}{cell.label}: {failure.run} run failed: {failure.message}\n")
        self.stream.flush()

    def finish(self) -> None:
        if self.live:
            self.stream.write("\r\x1b[K")
        self.stream.write(
            f"bench finished: {self.total} cells in {_minutes(time.perf_counter() - self.started)}\n"
        )
        self.stream.flush()


def _minutes(seconds: float) -> str:
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes} m {rest:02d} s" if minutes else f"{rest} s"


def run_bench_cells(
    settings: BenchSettings, *, cache_root: str | None = None, stream: TextIO | None = None
) -> list[CellResult]:
    """Run every cell in order; never raises for a failing cell."""
    cells = settings.cells()
    progress = BenchProgress(len(cells), stream)
    root = Path(cache_root) if cache_root else Path(tempfile.mkdtemp(prefix="torchkiln-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    results = []
    try:
        for index, cell in enumerate(cells):
            result = run_cell(
                settings, cell, root, lambda phase, i=index, c=cell: progress.show(i, c, phase)
            )
            if result.failure is not None:
                progress.failed(cell, result.failure)
            results.append(result)
    finally:
        if not cache_root:
            shutil.rmtree(root, ignore_errors=True)
    progress.finish()
    return results
