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
    step: Callable[[], Any],
    model: Any,
    started: float,
    clock: Callable[[], float],
    figure: Callable[[Any], float] | None = None,
) -> dict[str, Any]:
    """Call ``step`` until the model serves from the whole-model tier (or it never will).
    ``figure(result)`` is what a call measures for ``steady_before_switch_seconds`` (the
    generate workload: the median time per decoded token, as its steady state is), else the
    call's own time."""
    import torchkiln.tiered

    during: list[float] = []
    served_whole = None
    while clock() - started < TIMEOUT_SECONDS:
        before = torchkiln.tiered.tiers(model)
        began = clock()
        result = step()
        ended = clock()
        after = torchkiln.tiered.tiers(model)
        if after.calls["whole-model"] > before.calls["whole-model"]:
            served_whole = ended
            break
        if after.state == "stopped":
            break
        if before.state == "building":
            during.append(figure(result) if figure is not None else ended - began)
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


# -- reading a run's results -----------------------------------------------------------------


def _figures(result: Any) -> dict[str, Any] | None:
    """The tiered figures of a cell's cold run (``None`` if it has none)."""
    cold = result.cold or {}
    return cold.get("tiered")


def tiered_rows(results: list[Any]) -> list[tuple[str, ...]]:
    """One row per tiered cell: the four figures, each beside what it is compared with."""
    by_key = {(r.cell.depth, r.cell.batch, r.cell.strategy): r for r in results if r.ok}
    rows: list[tuple[str, ...]] = []
    for (depth, batch, strategy), result in sorted(by_key.items(), key=lambda kv: str(kv[0])):
        figures = _figures(result)
        if strategy != "tiered" or figures is None:
            continue
        regional = by_key.get((depth, batch, "regional"))
        full = by_key.get((depth, batch, "full"))
        rows.append(
            (
                str(depth),
                _s(result.cold_first_call),
                _x(result.cold_first_call, regional.cold_first_call if regional else None),
                _s(figures["seconds_to_whole_model"]),
                _x(figures["seconds_to_whole_model"], full.cold_first_call if full else None),
                _ms(figures["steady_before_switch_seconds"]),
                _x(figures["steady_before_switch_seconds"], regional.steady if regional else None),
                _ms(result.steady),
                _x(result.steady, full.steady if full else None),
                f"{figures['builder_peak_rss_mb'] or 0:.0f}",
            )
        )
    return rows


TIERED_HEADER = (
    "depth", "first call", "x regional", "to whole-model", "x full cold",
    "ms building", "x regional", "ms after", "x full", "builder MiB",
)  # fmt: skip
TIERED_LEGEND = (
    "tiered: first call (cold) and its ratio to regional's; to whole-model = from the first "
    "call's start to the end of the first call the whole-model form served, against full "
    "compile's cold first call; ms building = median call while the builder ran (against "
    "regional's steady state: the builder's cost to the foreground, unbounded here: "
    "tiered.when always, tiered.max_slowdown 0); ms after = steady state after the switch, "
    "against full compile's; builder MiB = its peak resident memory"
)


def _s(value: float | None) -> str:
    return f"{value:.2f} s" if value is not None else "-"


def _ms(value: float | None) -> str:
    return f"{value * 1000:.2f}" if value is not None else "-"


def _x(value: float | None, base: float | None) -> str:
    return f"{value / base:.3f}" if value is not None and base else "-"


def tiered_targets(results: list[Any], target: Any) -> list[Any]:
    """Issue 21's targets: first call <= 1.1x regional cold at every depth; time to whole-model
    speed <= 1.2x full's cold first call; steady state after the switch <= 1.02x full at
    depths 16 and 32."""
    by_key = {(r.cell.depth, r.cell.batch, r.cell.strategy): r for r in results if r.ok}
    first, to_whole, steady = [], [], []
    for (depth, batch, strategy), result in by_key.items():
        figures = _figures(result)
        if strategy != "tiered" or figures is None:
            continue
        where = f"depth {depth} batch {batch}"
        regional = by_key.get((depth, batch, "regional"))
        full = by_key.get((depth, batch, "full"))
        if regional and regional.cold_first_call and result.cold_first_call:
            first.append((where, result.cold_first_call / regional.cold_first_call))
        if full and full.cold_first_call and figures["seconds_to_whole_model"]:
            to_whole.append((where, figures["seconds_to_whole_model"] / full.cold_first_call))
        if depth in (16, 32) and full and full.steady and result.steady:
            steady.append((where, result.steady / full.steady))
    loaded_first, loaded_steady = [], []
    for (depth, batch, strategy), result in by_key.items():
        full = by_key.get((depth, batch, "full"))
        tiers = ((result.cold or {}).get("torchkiln_report") or {}).get("tiers") or {}
        if strategy != "precompiled" or not full or tiers.get("serving") != "whole-model":
            continue
        where = f"depth {depth} batch {batch}"
        if full.cold_first_call and result.cold_first_call:
            loaded_first.append((where, result.cold_first_call / full.cold_first_call))
        if full.steady and result.steady:
            loaded_steady.append((where, result.steady / full.steady))
    judged = [
            _judge(target, "tiered first call vs regional cold", 1.1, first),
            _judge(target, "tiered time to whole-model speed vs full cold first call", 1.2,
                   to_whole),
        _judge(target, "tiered steady after the switch vs full (depth 16, 32)", 1.02, steady),
    ]  # fmt: skip
    if loaded_first or loaded_steady:
        judged += [
            _judge(target, "whole-model artifact, new process: first call vs full cold", 0.1,
                   loaded_first),
            _judge(target, "whole-model artifact, new process: steady vs full", 1.02,
                   loaded_steady),
        ]  # fmt: skip
    return judged


def _judge(target: Any, name: str, limit: float, pairs: list[tuple[str, float]]) -> Any:
    if not pairs:
        return target(name, None, None, limit, "needs tiered with regional and full")
    worst = max(pairs, key=lambda p: p[1])
    detail = ", ".join(f"{where}: {ratio:.3f}x" for where, ratio in sorted(pairs))
    return target(name, worst[1] <= limit, worst[1], limit, detail)
