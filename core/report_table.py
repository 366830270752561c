"""Render a :class:`~torchkiln.report.CompileReport` as a console table (``str(report)``).

One row per region; regions that only reused their group's compiled code (nothing compiled,
no break, no recompile) are folded into one row per run of consecutive regions, so a
32-block model stays readable. Below the table: totals, then every reason the numbers hide
(graph breaks, recompiles, fallbacks, recompile-limit hits, what stays eager, later recompiles).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

HEADER = ("region", "group", "status", "graphs", "compile s", "first call s", "breaks",
          "recompiles", "cache hits")  # fmt: skip
LEFT_ALIGNED = frozenset({0, 1, 2})


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _is_plain_reuse(region: Any) -> bool:
    return bool(
        region.reused
        and region.graphs == 0
        and region.graph_break_count == 0
        and region.recompiles == 0
        and not region.fallback_reason
    )


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _row(region: Any) -> tuple[str, ...]:
    return (
        region.path or "<root>",
        region.group,
        region.status,
        str(region.graphs),
        _seconds(region.compile_seconds),
        _seconds(region.first_call_seconds),
        str(region.graph_break_count),
        str(region.recompiles),
        str(region.cache_hits),
    )


def _folded_row(run: Sequence[Any]) -> tuple[str, ...]:
    first, last = run[0], run[-1]
    seconds = [r.first_call_seconds for r in run if r.first_call_seconds is not None]
    paths = first.path if len(run) == 1 else f"{first.path} .. {last.path} ({len(run)} regions)"
    return (paths, first.group, "reused", "0", "0.00",
            _seconds(max(seconds)) if seconds else "-", "0", "0", "0")  # fmt: skip


def _rows(regions: Sequence[Any]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    run: list[Any] = []
    for region in regions:
        if _is_plain_reuse(region) and (not run or run[-1].group == region.group):
            run.append(region)
            continue
        if run:
            rows.append(_folded_row(run))
            run = []
        if _is_plain_reuse(region):
            run.append(region)
        else:
            rows.append(_row(region))
    if run:
        rows.append(_folded_row(run))
    return rows


def _format(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    return [
        "  ".join(
            cell.ljust(width) if index in LEFT_ALIGNED else cell.rjust(width)
            for index, (cell, width) in enumerate(zip(row, widths))
        ).rstrip()
        for row in rows
    ]


def _notes(report: Any) -> list[str]:
    notes: list[str] = []
    for region in report.regions:
        where = region.path or "<root>"
        for reason, count in region.graph_breaks.items():
            notes.append(f"graph break in {where} ({count}x): {reason}")
        for reason in region.recompile_reasons:
            notes.append(f"recompile in {where}: {reason}")
        if region.fallback_reason:
            notes.append(f"{where} runs eagerly: {region.fallback_reason}")
        if region.recompile_limit_hit:
            notes.append(f"{where} hit Dynamo's recompile limit; later new inputs run eagerly")
    for path, reason in report.eager:
        notes.append(f"eager: {path or '<root>'}: {reason}")
    for group, reasons in report.later_recompiles.items():
        for reason in reasons:
            notes.append(f"later recompile of group {group}: {reason}")
    return notes


def render_report(report: Any) -> str:
    """The report as a table with totals and notes (plain text, no colours)."""
    pending = sum(1 for r in report.regions if r.status == "pending")
    lines = [f"torchkiln compile report: backend {report.backend}, selector {report.selector}"]
    if report.reason:
        lines.append(f"  {report.reason}")
    if report.regions:
        lines += _format([HEADER, *_rows(report.regions)])
    else:
        lines.append("  (no regions)")
    total = (
        f"total: {_plural(len(report.regions), 'region')}, "
        f"{_plural(report.total_graphs, 'graph')} compiled in {report.total_compile_seconds:.2f} s"
    )
    if pending:
        total += f"; {pending} not called yet"
    lines.append(total)
    lines += [f"  {note}" for note in _notes(report)]
    return "\n".join(lines)
