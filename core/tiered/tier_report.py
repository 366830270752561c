"""What :func:`torchkiln.report` says about the tiers (``report.tiers``), and the tiers' names."""

from __future__ import annotations

import attrs

from torchkiln.engine.states import describe

REGIONAL = "regional"
WHOLE = "whole-model"


@attrs.define
class TierReport:
    """What :func:`torchkiln.report` says about the tiers."""

    serving: str
    """The tier the next call goes to (``regional`` or ``whole-model``)."""
    state: str
    """The whole-model form's :class:`~torchkiln.engine.states.State`: ``pending`` (observing
    the first calls, then building: :attr:`builds` says whether a build started), ``serving``
    (from :attr:`source`), ``failed`` (none will come: see :attr:`reason`)."""
    calls: dict[str, int]
    """Calls served by each tier so far."""
    reason: str | None = None
    """Why the model does not serve from the whole-model tier (yet), or why a call missed it."""
    switched_at_call: int | None = None
    seconds_to_switch: float | None = None
    """From the first call's start to the switch."""
    build_seconds: float | None = None
    builder_peak_rss_mb: float | None = None
    load_seconds: float | None = None
    dropped_guards: dict[str, int] = attrs.Factory(dict)
    misses: int = 0
    """Calls after the switch that no whole-model entry fitted (served regionally)."""
    miss_lines: tuple[str, ...] = ()
    """``missed N: reason`` per first failing guard (:class:`~torchkiln.engine.miss_log.MissLog`)."""
    builds: int = 0
    """Builders started: 1, or 2 when the calls after the first showed more than it."""
    rebuild_reason: str | None = None
    """Why a second builder was started (``None``: the first one covered every call seen)."""
    builder_processes: int = 0
    """Builder processes this process started (in a job, 0 on every rank but rank 0)."""
    builder_slowdown: float | None = None
    """What the builder cost the steps, measured (:mod:`torchkiln.tiered.governor`): the
    median step with it running over the median step with it paused; ``None``: not measured
    (no builder, or it finished before a probe)."""
    builder_lowered_from: float | None = None
    """The cost measured at the builder's own priority, when it was over the bound and the
    builder was lowered to nice 19 (``None``: not lowered)."""
    builder_lowered: bool = False
    """Whether the builder ran at nice 19: measured over the bound, or from the start when
    the steps left no core free (``tiered.when: always``)."""
    builder_period: int = 1
    """The builder ran one step in this many (above 1: its cost was over the bound)."""
    measured_steps: dict[str, int] = attrs.Factory(dict)
    """Steps measured while building: ``running`` (builder running) and ``paused``."""
    slowdown_bound: float = 0.0
    """``tiered.max_slowdown`` (0: no bound)."""
    source: str | None = None
    """Where the serving form came from: ``the builder``, or the directory it was found in at
    compile time (:attr:`loaded_from`)."""
    job_rank: int | None = None
    """In a job whose ranks share: this rank (rank 0 builds for all)."""
    loaded_from: str | None = None
    """The directory the form was loaded from when the model was compiled (``None``: not
    loaded then): an artifact directory's, or the store's form for this model."""

    def lines(self) -> list[str]:
        out = [
            f"tiers: whole-model form {describe(self.state, self.source)}; calls regional "
            f"{self.calls[REGIONAL]}, whole-model {self.calls[WHOLE]}"
        ]
        if self.loaded_from is not None:
            out.append(f"  loaded from {self.loaded_from} when compiled")
        elif self.switched_at_call is not None and self.seconds_to_switch is not None:
            out.append(
                f"  switched before call {self.switched_at_call}, "
                f"{self.seconds_to_switch:.1f} s after the first call"
            )
        if self.build_seconds is not None:
            out.append(
                f"  builder: {self.build_seconds:.1f} s, peak memory "
                f"{self.builder_peak_rss_mb} MiB; loading {self.load_seconds or 0:.2f} s"
            )
        if self.builder_slowdown is not None:
            out.append(self._cost_line())
        if self.job_rank is not None:
            who = "this rank's builder" if self.job_rank == 0 else "rank 0's builder"
            out.append(f"  one builder for the job: {who}; every rank switches at the same call")
        if self.rebuild_reason:
            out.append(f"  rebuilt: {self.rebuild_reason}")
        if self.misses:
            calls = "call" if self.misses == 1 else "calls"
            out.append(f"  {self.misses} {calls} missed the whole-model form (served regionally)")
            out += self.miss_lines
        if self.reason:
            out.append(f"  reason: {self.reason}")
        return out

    def _cost_line(self) -> str:
        running = self.measured_steps.get("running", 0)
        paused = self.measured_steps.get("paused", 0)
        line = (
            f"  builder's cost to the steps: {self.builder_slowdown:.2f}x (median of {running} "
            f"steps with it running / {paused} with it paused)"
        )
        if not self.slowdown_bound:
            return line + "; no bound (tiered.max_slowdown 0)"
        line += f"; bound {self.slowdown_bound:g}x"
        if self.builder_lowered_from is not None:
            line += f" ({self.builder_lowered_from:.2f}x at its own priority: lowered to nice 19)"
        elif self.builder_lowered:
            line += " (at nice 19 from the start: the steps left no core free)"
        if self.builder_period > 1:
            line += f": over it, the builder runs 1 step in {self.builder_period}"
        return line
