"""Render a :class:`~torchkiln.report.CompileReport` as a console table (``str(report)``).

One row per region; regions that only reused their group's compiled code (nothing compiled,
no break, no recompile) are folded into one row per run of consecutive regions, so a
32-block model stays readable. Below the table: totals, then every reason the numbers hide
(graph breaks, recompiles, fallbacks, recompile-limit hits, what stays eager, later recompiles).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

HEADER = ("region", "group", "status", "graphs", "compile s", "load s", "first call s", "breaks",
          "recompiles", "cache hits", "later graphs", "later breaks", "eager calls")  # fmt: skip
LEFT_ALIGNED = frozenset({0, 1, 2})


def plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _is_plain_reuse(region: Any) -> bool:
    return bool(
        region.reused
        and region.graphs == 0
        and region.graph_break_count == 0
        and region.recompiles == 0
        and not region.fallback_reason
        and not region.reasons
        and not region.eager_calls
        and region.load_seconds is None
    )


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _loaded_only(region: Any) -> bool:
    """Its group's code was loaded on this region's first call and nothing was compiled."""
    return bool(region.loaded_from and not region.graphs and not region.compile_seconds)


def _row(region: Any) -> tuple[str, ...]:
    return (
        region.path or "<root>",
        region.group,
        region.status,
        str(region.graphs),
        "-" if _loaded_only(region) else _seconds(region.compile_seconds),
        _seconds(region.load_seconds),
        _seconds(region.first_call_seconds),
        str(region.graph_break_count),
        str(region.recompiles),
        str(region.cache_hits),
        str(region.later_graphs),
        str(sum(region.later_graph_breaks.values())),
        str(region.eager_calls),
    )


def _folded_row(run: Sequence[Any]) -> tuple[str, ...]:
    first, last = run[0], run[-1]
    seconds = [r.first_call_seconds for r in run if r.first_call_seconds is not None]
    paths = first.path if len(run) == 1 else f"{first.path} .. {last.path} ({len(run)} regions)"
    return (paths, first.group, "reused", "0", "0.00", "-",
            _seconds(max(seconds)) if seconds else "-", "0", "0", "0", "0", "0", "0")  # fmt: skip


def _rows(regions: Sequence[Any]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    run: list[Any] = []
    for region in regions:
        plain = _is_plain_reuse(region)
        if run and not (plain and run[-1].group == region.group):
            rows.append(_folded_row(run))
            run = []
        if plain:
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


def _where(paths: Sequence[str]) -> str:
    shown = [p or "<root>" for p in paths]
    if len(shown) <= 3:
        return ", ".join(shown)
    return f"{shown[0]} .. {shown[-1]} ({len(shown)} regions)"


_KIND_LABEL = {
    "guard": "recompile",
    "recompile limit": "recompile limit hit",
    "eager": "runs eagerly",
    "failed": "failed",
    "compiled": "still compiled",
}


def _notes(report: Any) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """One line per distinct reason (regions that share it listed together), the named causes
    seen with their remedies, and Dynamo's full text per line (for verbose)."""
    grouped: dict[tuple[str, str, str], list[Any]] = {}
    for region in report.regions:
        for reason in region.reasons:
            grouped.setdefault((reason.kind, reason.text, reason.phase), []).append(
                (region.path, reason)
            )
    lines: list[str] = []
    causes: dict[str, str] = {}
    full: dict[str, str] = {}
    for (kind, text, phase), found in grouped.items():
        count = sum(reason.count for _, reason in found)
        times = f", {count}x" if count > len(found) else ""
        reason = found[0][1]
        cause = f" [cause: {reason.cause}]" if reason.cause else ""
        line = f"{_KIND_LABEL.get(kind, kind)} in {_where([p for p, _ in found])} ({phase}{times}): {text}{cause}"
        lines.append(line)
        if reason.cause and reason.remedy:
            causes.setdefault(reason.cause, reason.remedy)
        full[line] = next((r.full for _, r in found if r.full), "")
    for path, reason in report.eager:
        lines.append(f"eager: {path or '<root>'}: {reason}")
    return lines, causes, full


def _loaded_total(regions: Sequence[Any]) -> str:
    """``; 1 group loaded from store in 0.05 s``: what was loaded rather than compiled."""
    loaded = [r for r in regions if r.loaded_from]
    if not loaded:
        return ""
    sources = ", ".join(dict.fromkeys(r.loaded_from for r in loaded))
    known = [r.load_seconds for r in loaded if r.load_seconds is not None]
    seconds = f" in {sum(known):.2f} s" if len(known) == len(loaded) else ""
    return f"; {plural(len(loaded), 'group')} loaded from {sources}{seconds}"


def render_report(report: Any) -> str:
    """The report as a table with totals and notes (plain text, no colours)."""
    pending = sum(1 for r in report.regions if r.status == "pending")
    lines = [report.title]
    if report.reason:
        lines.append(f"  {report.reason}")
    if report.regions:
        lines += _format([HEADER, *_rows(report.regions)])
    else:
        lines.append("  (no regions)")
    total = (
        f"total: {plural(len(report.regions), 'region')}, "
        f"{plural(report.total_graphs, 'graph')} compiled in {report.total_compile_seconds:.2f} s"
    )
    total += _loaded_total(report.regions)
    if pending:
        total += f"; {pending} not called yet"
    lines.append(total)
    notes, causes, full = _notes(report)
    for note in notes:
        lines.append(f"  {note}")
        if report.verbose:
            lines += [f"      {text}" for text in full.get(note, "").splitlines()]
    for cause, remedy in causes.items():
        lines.append(f"  remedy for {cause}: {remedy}")
    for part in (report.tiers, report.remote_cache):
        lines += part.lines() if part is not None else []
    lines += [f"  code of group {line}" for line in report.served_from]
    lines += [report.frozen] if report.frozen is not None else []
    if report.frozen is not None or report.verbose:
        lines += [f"  covers {line}" for line in report.covers]
    lines += [f"  note: {line}" for line in report.notes]
    lines += report.job.lines() if report.job is not None else []
    return "\n".join(lines)
