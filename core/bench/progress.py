"""What a running bench prints on stderr: which step it is at, what its worker is doing, and one
line per finished cell (so a log of a stopped run still has the numbers)."""

from __future__ import annotations

import re
import sys
import time
from typing import TextIO

from torchkiln.bench.results import CellResult, RunFailure

COUNTED = re.compile(r"(?P<done>\d+)/(?P<total>\d+)( \w+)?$")
"""Counted work in a worker's progress line: ``steady 7/10`` or ``steady 7/10 rounds``."""
LOG_EVERY_SECONDS = 10.0
"""A log (not a terminal) gets counted progress at most this often, and at its end."""


def minutes(seconds: float) -> str:
    whole, rest = divmod(int(seconds), 60)
    return f"{whole} m {rest:02d} s" if whole else f"{rest} s"


class BenchProgress:
    """``[3/10] depth 16 batch 1 regional: cold run (2 m 10 s elapsed)`` on ``stream``.

    One progress can span several runs of a plan: each numbers its steps from :attr:`done` on
    (:meth:`next_step`), and :attr:`context` (``forward, mode default``) tells them apart."""

    def __init__(self, total: int, stream: TextIO | None = None):
        self.total = total
        self.done = 0
        self.context = ""
        self.stream = stream if stream is not None else sys.stderr
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self.started = time.perf_counter()
        self._run_started = self._logged = self.started
        self._said = ""

    def next_step(self) -> int:
        """The index of the step that starts now."""
        self.done += 1
        return self.done - 1

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
                f"{where}{doing} ({minutes(now - self.started)} elapsed, "
                f"{self.total - index - 1} more to go)"
            )
        else:
            text = f"    {where}: {said} ({int(now - self._run_started)} s)"
        self._logged = now
        self.stream.write("\r\x1b[K" + text if self.live else text + "\n")
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

    def _line(self, label: str, text: str) -> None:
        prefix = "\r\x1b[K" if self.live else ""
        self.stream.write(f"{prefix}{self._where(label)}: {text}\n")
        self.stream.flush()

    def failed(self, label: str, failure: RunFailure) -> None:
        self._line(label, f"{failure.run} run failed: {failure.message}")

    def measured(self, label: str, result: CellResult) -> None:
        steady = "" if result.steady is None else f", steady {result.steady * 1000:.2f} ms"
        first = result.cold_first_call
        self._line(label, f"first call {'-' if first is None else f'{first:.2f} s'}{steady}")

    def skipped(self, label: str, why: str) -> None:
        self._line(label, f"skipped ({why})")

    def finish(self) -> None:
        if self.live:
            self.stream.write("\r\x1b[K")
        elapsed = minutes(time.perf_counter() - self.started)
        self.stream.write(f"bench finished: {self.total} steps in {elapsed}\n")
        self.stream.flush()
