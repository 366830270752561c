"""The bench results as a console table, with the ratios to full compile next to the times."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torchkiln.bench.results import CellResult
from torchkiln.bench.targets import Target

HEADER = (
    "depth", "batch", "strategy",
    "first call", "first/full", "warm", "warm/cold",
    "steady ms", "steady/full", "graphs", "recompiles", "breaks", "max |diff|",
)  # fmt: skip
RIGHT_ALIGNED = frozenset(range(len(HEADER))) - {2}
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


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _ratio(value: float | None, base: float | None, digits: int = 2) -> str:
    if value is None or not base:
        return "-"
    return f"{value / base:.{digits}f}"


def _milliseconds(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.2f}"


def _row(result: CellResult, full: CellResult | None) -> tuple[str, ...]:
    cell = result.cell
    depth = "-" if cell.depth is None else str(cell.depth)
    if result.skipped or not result.ok:
        missing = f"skipped: {result.skipped}" if result.skipped else "FAILED"
        return (depth, str(cell.batch), cell.strategy, missing, *[""] * 9)
    full_ok = full if full is not None and full.ok and full is not result else None
    cold = result.cold_first_call
    counts = (result.cold or {}).get("after_later_calls", {})
    diff = (result.cold or {}).get("max_abs_diff")
    failure_note = f" ({result.failure.run} failed)" if result.failure else ""
    return (
        depth,
        str(cell.batch),
        cell.strategy + failure_note,
        _seconds(cold),
        _ratio(cold, full_ok.cold_first_call) if full_ok else "",
        _seconds(result.warm_first_call),
        _ratio(result.warm_first_call, cold),
        _milliseconds(result.steady),
        _ratio(result.steady, full_ok.steady, 3) if full_ok else "",
        str(counts.get("graphs", "-")),
        str(counts.get("recompiles", "-")),
        str(counts.get("graph_breaks", "-")),
        "-" if diff is None else f"{diff:.1e}",
    )


def _format(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(width) if index in RIGHT_ALIGNED else cell.ljust(width)
            for index, (cell, width) in enumerate(zip(row, widths))
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def render_table(results: Sequence[CellResult]) -> str:
    """One row per cell; ``x full`` is the cell's time divided by full compile's, same depth and
    batch (first call: cold runs; steady: medians)."""
    full = {(r.cell.depth, r.cell.batch): r for r in results if r.cell.strategy == "full"}
    rows: list[tuple[str, ...]] = [HEADER]
    previous: tuple[int | None, int] | None = None
    for result in results:
        key = (result.cell.depth, result.cell.batch)
        if previous is not None and key != previous:
            rows.append(("",) * len(HEADER))
        previous = key
        rows.append(_row(result, full.get(key)))
    return "\n".join(_format(rows))


def tiered_rows(results: Sequence[CellResult]) -> list[tuple[str, ...]]:
    """One row per tiered cell: its figures, each beside what it is compared with."""
    by_key = {(r.cell.depth, r.cell.batch, r.cell.strategy): r for r in results if r.ok}
    rows: list[tuple[str, ...]] = []
    for (depth, batch, strategy), result in sorted(by_key.items(), key=lambda kv: str(kv[0])):
        figures = (result.cold or {}).get("tiered")
        if strategy != "tiered" or figures is None:
            continue
        regional = by_key.get((depth, batch, "regional"))
        full = by_key.get((depth, batch, "full"))
        to_whole = figures["seconds_to_whole_model"]
        building = figures["steady_before_switch_seconds"]
        rows.append(
            (
                str(depth),
                _seconds(result.cold_first_call),
                _ratio(result.cold_first_call, regional.cold_first_call if regional else None, 3),
                _seconds(to_whole),
                _ratio(to_whole, full.cold_first_call if full else None, 3),
                _milliseconds(building),
                _ratio(building, regional.steady if regional else None, 3),
                _milliseconds(result.steady),
                _ratio(result.steady, full.steady if full else None, 3),
                f"{figures['builder_peak_rss_mb'] or 0:.0f}",
            )
        )
    return rows


def legend(settings: dict[str, Any]) -> dict[str, str]:
    """What each column of :func:`render_table` means, for this run's workload."""
    generate = settings.get("workload") == "generate"
    first = (
        "time to the first generated token (strategy applied, prefill compiled and run)"
        if generate
        else "applying the strategy + the first call (where compiling happens)"
    )
    steady = (
        "median time per decoded token after warm-up"
        if generate
        else "median call time after warm-up"
    )
    return {
        "depth": "decoder blocks in the model",
        "batch": "batch size",
        "strategy": "how the model is compiled (docs/benchmarks.md, 'What is measured')",
        "first call": f"{first}, in a fresh process with an empty inductor cache (cold)",
        "first/full": "first call / full's first call at the same depth and batch "
        "(below 1: starts faster than full torch.compile)",
        "warm": "the first call again in another fresh process that keeps the cold run's "
        "cache directory ('-': not run for this strategy)",
        "warm/cold": "warm / first call: what the persistent compile cache saves",
        "steady ms": f"{steady}, {_steady_where(settings)} ('-': not timed at this depth)",
        "steady/full": "steady ms / full's steady ms at the same depth and batch "
        "(above 1: slower per call than full torch.compile)",
        "graphs": "graphs Dynamo compiled (after the first call and a few more)",
        "recompiles": "recompilations Dynamo made in those calls",
        "breaks": "graph breaks Dynamo recorded",
        "max |diff|": "generated token ids that differ from eager"
        if generate
        else "largest absolute difference of the first output from the same model run eagerly",
    }


def render_legend(settings: dict[str, Any]) -> str:
    meanings = legend(settings)
    width = max(map(len, meanings))
    return "\n".join(
        ["columns:", *(f"  {name.ljust(width)}  {meaning}" for name, meaning in meanings.items())]
    )


MISSED_MEANS = (
    "A target NOT met means this run measured a ratio worse than the one torchkiln promises "
    "on this model (docs/benchmarks.md#targets).\nOn a machine busy with other work, timing "
    "noise alone can miss one: rerun on a quiet machine before reading it as a regression.\n"
    "The exit status is 0 whatever the targets say; with --check it is 3 when a target is "
    "NOT met."
)


def render_targets(targets: Sequence[Target]) -> str:
    lines = ["targets (each judged once; 'not judged': stated at a depth this run lacks):"]
    for target in targets:
        value = "" if target.value is None else f" {target.value:.3g}x (limit {target.limit:g}x)"
        lines.append(f"  [{target.verdict}] {target.name}:{value} - {target.detail}")
    missed = sum(1 for t in targets if t.met is False)
    if missed:
        lines += [f"{missed} target(s) NOT met. " + MISSED_MEANS]
    return "\n".join(lines)


def _steady_where(settings: dict[str, Any]) -> str:
    if settings.get("steady_in_first_call"):
        return f"{settings.get('steady_iters')} calls timed in the first-call process"
    return (
        f"{settings.get('steady_iters')} rounds timing every strategy of a row group once each, "
        "in one process"
    )


def _precision(settings: dict[str, Any]) -> str:
    """``, bfloat16, mode reduce-overhead`` (nothing for the float32 default mode)."""
    dtype = settings.get("dtype") or "float32"
    mode = settings.get("mode")
    return ("" if dtype == "float32" else f", {dtype}") + (f", mode {mode}" if mode else "")


def render_header(settings: dict[str, Any], environment: dict[str, Any]) -> str:
    workload = settings.get("workload") or ("train" if settings.get("train") else "forward")
    if workload == "generate":
        shape = (
            f"prompt {settings['seq']} tokens, generate {settings.get('new_tokens')} tokens "
            f"(greedy, default KV cache), backend {settings['backend']}"
        )
    else:
        mode = "forward+backward" if workload == "train" else "forward (no_grad)"
        shape = f"seq {settings['seq']}, backend {settings['backend']}, {mode}"
    return (
        f"torchkiln bench: model {settings['model']}{_precision(settings)}, {shape}, "
        f"device {environment.get('device_name')}, {environment.get('torch_threads')} threads, "
        f"torch {environment.get('torch')}"
    )


def render_failures(results: Sequence[CellResult]) -> str:
    lines = []
    for result in results:
        if result.failure is not None:
            lines.append(f"{result.cell.label}: {result.failure.run} run: {result.failure.message}")
            lines += [f"    {line}" for line in result.failure.stderr_tail.splitlines()[-8:]]
        if result.steady_failure is not None:
            lines.append(f"{result.cell.label}: steady-state run: {result.steady_failure}")
    return "\n".join(["failures:", *lines]) if lines else ""


def render_all(
    settings: dict[str, Any],
    environment: dict[str, Any],
    results: Sequence[CellResult],
    targets: Sequence[Target],
) -> str:
    parts = [
        render_header(settings, environment),
        "",
        render_table(results),
        "",
        render_legend(settings),
        "",
    ]
    tiered = tiered_rows(results)
    if tiered:
        parts += [*_format([TIERED_HEADER, *tiered]), TIERED_LEGEND, ""]
    parts.append(render_targets(targets))
    failures = render_failures(results)
    if failures:
        parts += ["", failures]
    return "\n".join(parts)
