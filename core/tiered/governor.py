"""Bounding what the builder costs the foreground's steps (``tiered.max_slowdown``).

A *step* is the time from one root call's start to the next's. While it builds, the builder is
now and then paused for a couple of steps to compare them with the steps it runs in; over the
bound it is first lowered in priority, then run one step in ``period`` (a slower build, never a
slower loop). The governor is bookkeeping only: at each root call it says whether the builder
runs until the next; :class:`~torchkiln.tiered.process.BuilderProcess` pauses it. docs/tiered.md
("A bound on what the builder costs the steps") says how and how often.
"""

from __future__ import annotations

import math
import statistics

import attrs

UNMEASURED_STEPS = 2
"""Steps not measured after a builder starts: the regional tier compiles in them (the first
call, and the recompile for sizes that vary), which is not the builder's cost."""
FIRST_PROBE_AFTER = 4
"""Steps with the builder running before the first probe."""
PROBE_STEPS = 2
"""Steps a probe pauses the builder for."""
LONGEST_PROBE_GAP = 128
MOST_PERIOD = 256
"""The builder runs at least one step in this many: throttled, it still finishes (the bound
holds up to a ratio of 1 + 255 x (bound - 1): 64x at 1.25)."""
LOWEST_PRIORITY = 19
"""The niceness a builder over the bound is lowered to before it is throttled."""
WINDOW = 8
"""The latest samples of each kind a ratio is taken from."""


@attrs.define
class StepGovernor:
    """Measures the builder's cost to the steps and says when it may run."""

    bound: float
    """The most the builder may slow the mean step (``tiered.max_slowdown``; 0: no bound)."""
    running: list[float] = attrs.Factory(list)
    """Seconds of each measured step during which the builder ran."""
    paused: list[float] = attrs.Factory(list)
    """Seconds of each measured step during which it was paused."""
    period: int = 1
    """The builder runs one step in ``period`` (1: every step)."""
    slowdown: float | None = None
    """The latest measured ratio: median running step / median paused step."""
    lowered_from: float | None = None
    """The ratio measured at the builder's own priority, when it was over the bound and the
    builder was lowered to :data:`LOWEST_PRIORITY` (``None``: not measured so)."""
    lowered: bool = False
    """Whether the builder runs at :data:`LOWEST_PRIORITY`: measured over the bound, or from
    the start (``tiered.when: always`` with no core left free: :meth:`start_lowered`)."""
    _last: float | None = None
    _ran: bool | None = None
    _unmeasured: int = UNMEASURED_STEPS
    _until_probe: int = FIRST_PROBE_AFTER
    _probe_gap: int = 16
    _pause_left: int = 0
    _phase: int = 0

    def restarted(self) -> None:
        """A new builder started: its first steps land on the regional recompile again."""
        self._unmeasured = UNMEASURED_STEPS

    def step(self, now: float, measured: bool = True) -> bool:
        """At a root call's start (``now``: ``time.perf_counter()``): record the step that
        ended (unless not ``measured``: a pause cut short because the process idled), and say
        whether the builder runs during the next one."""
        if self._last is not None and self._ran is not None:
            if self._unmeasured:
                self._unmeasured -= 1
            elif measured:
                (self.running if self._ran else self.paused).append(now - self._last)
                self._measure()
        self._last = now
        self._ran = self._next()
        return self._ran

    def _next(self) -> bool:
        if not self.bound:
            return True
        if self.period > 1:  # throttled: one step running, then period - 1 paused
            self._phase = (self._phase + 1) % self.period
            return self._phase == 0
        if self._unmeasured:
            return True
        if self._pause_left:
            self._pause_left -= 1
            return False
        self._until_probe -= 1
        if self._until_probe > 0:
            return True
        self._pause_left = PROBE_STEPS - 1
        self._until_probe = self._probe_gap
        self._probe_gap = min(self._probe_gap * 2, LONGEST_PROBE_GAP)
        return False

    def _measure(self) -> None:
        if len(self.running) < 2 or not self.paused or self._pause_left:
            return  # a probe is still pausing: decide on its whole sample
        ratio = statistics.median(self.running[-WINDOW:]) / statistics.median(self.paused[-WINDOW:])
        self.slowdown = ratio
        if not self.bound:
            return
        if ratio > self.bound and not self.lowered:
            self.lowered, self.lowered_from = True, ratio  # lower it, then measure it afresh
            self.running.clear()
            self._until_probe = FIRST_PROBE_AFTER
            return
        before = self.period
        self.period = min(period_for(ratio, self.bound), MOST_PERIOD)
        if self.period != before:
            self._phase = 0
            self._until_probe = self._probe_gap  # unthrottled again: probe as before

    def start_lowered(self) -> None:
        """The builder starts at the lowest priority: the steps keep every core busy (the
        steps the governor does not measure, the regional compile's, would pay otherwise)."""
        if self.bound:
            self.lowered = True

    @property
    def priority(self) -> int | None:
        """The niceness the builder should have now (``None``: its own, ``tiered.nice``)."""
        return LOWEST_PRIORITY if self.lowered else None


def period_for(ratio: float, bound: float) -> int:
    """The smallest ``period`` whose mean step, ``(ratio + period - 1) / period``, is within
    ``bound`` (1 when running every step already is)."""
    if ratio <= bound:
        return 1
    return math.ceil((ratio - 1) / (bound - 1) - 1e-9)  # 8.000000001 (float noise) is 8
