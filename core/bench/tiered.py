"""The ``tiered`` bench strategy's own figures.

Besides the first call and the steady state every strategy has (the tiered cell's
``steady_median_seconds`` is the steady state *after* the switch), a tiered cell measures:

* ``seconds_to_whole_model``: from the start of the first call to the end of the first call
  served by the whole-model form, calling the step back to back as a training or serving loop
  would (``generate`` calls for the generate workload);
* ``steady_before_switch_seconds``: the median call while the builder was compiling, which
  shows how much the builder slows the user's process (compare with regional's steady state);
* the builder's own seconds, peak resident memory, and the loading time of the switch.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

TIMEOUT_SECONDS = 1800.0
"""A builder still running after this long is reported as not having switched."""


def until_whole_model(
    step: Callable[[], Any], model: Any, started: float, clock: Callable[[], float]
) -> dict[str, Any]:
    """Call ``step`` until the model serves from the whole-model tier (or it never will)."""
    import torchkiln.tiered

    during: list[float] = []
    served_whole = None
    while clock() - started < TIMEOUT_SECONDS:
        before = torchkiln.tiered.tiers(model)
        began = clock()
        step()
        ended = clock()
        after = torchkiln.tiered.tiers(model)
        if after.calls["whole-model"] > before.calls["whole-model"]:
            served_whole = ended
            break
        if after.state == "stopped":
            break
        if before.state == "building":
            during.append(ended - began)
    tiers = torchkiln.tiered.tiers(model)
    return {
        "seconds_to_whole_model": served_whole - started if served_whole else None,
        "steady_before_switch_seconds": statistics.median(during) if during else None,
        "calls_before_switch": tiers.calls["regional"],
        "state": tiers.state,
        "reason": tiers.reason,
        "build_seconds": tiers.build_seconds,
        "builder_peak_rss_mb": tiers.builder_peak_rss_mb,
        "load_seconds": tiers.load_seconds,
    }


def switched(step: Callable[[], Any], model: Any) -> Callable[[], Any]:
    """``step`` after the model has switched (the steady-state run times the whole-model
    tier); raises when it cannot switch, so the cell reports why."""
    import torchkiln.tiered

    for _ in range(3):
        step()
        if torchkiln.tiered.tiers(model).state != "observing":
            break
    torchkiln.tiered.wait(model, TIMEOUT_SECONDS)
    step()
    tiers = torchkiln.tiered.tiers(model)
    if tiers.serving != "whole-model":
        raise RuntimeError(f"tiered did not switch: {tiers.state}: {tiers.reason}")
    return step


def now() -> float:
    return time.perf_counter()
