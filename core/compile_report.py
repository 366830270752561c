"""``torchkiln.report(model)``: per region, what Dynamo compiled and what it cost."""

from __future__ import annotations

from typing import Any

import attrs

from torchkiln.dynamo_metrics import CompileRecord, all_records
from torchkiln.region_compiler import CompileState, RegionState


@attrs.frozen
class RegionReport:
    """One region after its first call."""

    path: str
    group: str
    status: str
    """``compiled``, ``eager`` (fell back), ``failed``, or ``pending`` (not called yet)."""
    graphs: int
    """Graphs Dynamo compiled during this region's first call (0 when it reused its group's)."""
    compile_seconds: float
    """Dynamo's own compile time for those graphs."""
    first_call_seconds: float | None
    graph_breaks: dict[str, int]
    recompiles: int
    recompile_reasons: tuple[str, ...]
    cache_hits: int
    """Inductor FX-graph and AOTAutograd cache hits while compiling this region."""
    reused: bool
    """The region ran its group's already-compiled code (a Dynamo cache hit)."""
    fallback_reason: str | None
    recompile_limit_hit: bool

    @property
    def graph_break_count(self) -> int:
        return sum(self.graph_breaks.values())


@attrs.frozen
class CompileReport:
    """What :func:`torchkiln.report` returns. ``str()`` renders a table."""

    backend: str
    selector: str
    reason: str
    regions: tuple[RegionReport, ...]
    eager: tuple[tuple[str, str], ...]
    later_recompiles: dict[str, tuple[str, ...]]
    """Recompiles after the first calls (new shapes, say), by group, with Dynamo's reasons."""

    @property
    def total_graphs(self) -> int:
        return sum(r.graphs for r in self.regions)

    @property
    def total_compile_seconds(self) -> float:
        return sum(r.compile_seconds for r in self.regions)

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self, recurse=True) | {
            "total_graphs": self.total_graphs,
            "total_compile_seconds": self.total_compile_seconds,
        }

    def __str__(self) -> str:
        try:
            from torchkiln.report_table import render_report
        except ImportError:
            return _plain_table(self)
        return render_report(self)


def _region_report(state: RegionState, limit_hit_at: str | None) -> RegionReport:
    records: list[CompileRecord] = state.records
    reasons = tuple(r.recompile_reason for r in records if r.recompile_reason)
    status, fallback = state.status, state.fallback_reason
    if limit_hit_at == state.region.path and status == "compiled":
        # This region's own frame hit the limit: Dynamo ran it eagerly.
        status = "eager"
        fallback = (
            f"hit Dynamo's recompile limit in group {state.region.group!r}; this region "
            "runs eagerly"
        )
    elif limit_hit_at is not None and status == "compiled" and not records:
        # Dynamo stopped compiling this group's code: this region's frame runs eagerly.
        status = "eager"
        fallback = (
            f"Dynamo's recompile limit was hit in group {state.region.group!r} "
            f"(at {limit_hit_at or '<root>'}); this region runs eagerly"
        )
    return RegionReport(
        path=state.region.path,
        group=state.region.group,
        status=status,
        graphs=state.graphs,
        compile_seconds=round(sum(r.seconds for r in records), 6),
        first_call_seconds=state.first_call_seconds,
        graph_breaks=dict(state.graph_breaks),
        recompiles=len(reasons),
        recompile_reasons=reasons,
        cache_hits=sum(r.cache_hits for r in records),
        reused=status == "compiled" and not records,
        fallback_reason=fallback,
        recompile_limit_hit=any(r.hit_recompile_limit for r in records),
    )


def _frame(record: CompileRecord) -> str:
    """Dynamo's frame id (``3`` of compile id ``3/1``): the same for every compile of one code."""
    return record.compile_id.split("/")[0]


def _own_frames(state: CompileState) -> dict[str, set[str]]:
    """Group -> the frame ids of its compiled function's code."""
    frames: dict[str, set[str]] = {}
    for region_state in state.regions:
        code = state.code_names.get(region_state.region.group, "")
        frames.setdefault(region_state.region.group, set()).update(
            _frame(r) for r in region_state.records if _runs_code(r.co_name, code)
        )
    return frames


def _runs_code(co_name: str, code: str) -> bool:
    """The group's own function, or Dynamo's resume function after a graph break in it."""
    return bool(code) and (
        co_name == code or co_name.startswith(f"torch_dynamo_resume_in_{code}_at_")
    )


def _is_own(record: CompileRecord, code: str, frames: set[str]) -> bool:
    # Dynamo's record of a recompile-limit hit has no co_name: match it by frame id.
    return _runs_code(record.co_name, code) or (not record.co_name and _frame(record) in frames)


def _region_reports(state: CompileState) -> list[RegionReport]:
    limit_hit_at: dict[str, str] = {}
    own_frames = _own_frames(state)
    reports = []
    for region_state in state.regions:
        group = region_state.region.group
        # Only the group's own frames (and their resume functions) count: a limit hit in a
        # library frame called from the region (DeepSpeed ZeRO-3's hooks) leaves the group's code
        # compiled and reused.
        code = state.code_names.get(group, "")
        if any(
            r.hit_recompile_limit and _is_own(r, code, own_frames.get(group, set()))
            for r in region_state.records
        ):
            limit_hit_at.setdefault(group, region_state.region.path)
        reports.append(_region_report(region_state, limit_hit_at.get(group)))
    return reports


def build_report(state: CompileState) -> CompileReport:
    seen = {r.compile_id for s in state.regions for r in s.records}
    later: dict[str, list[str]] = {}
    own_frames = _own_frames(state)
    for record in all_records():
        group = next(
            (
                g
                for g, code in state.code_names.items()
                if _is_own(record, code, own_frames.get(g, set()))
            ),
            None,
        )
        if group is not None and record.compile_id not in seen:
            later.setdefault(group, []).append(
                record.recompile_reason or record.fail_reason or "compiled"
            )
    return CompileReport(
        backend=state.config.backend,
        selector=state.plan.selector,
        reason=state.plan.reason,
        regions=tuple(_region_reports(state)),
        eager=tuple((e.path, e.reason) for e in state.plan.eager),
        later_recompiles={g: tuple(v) for g, v in later.items()},
    )


def _plain_table(report: CompileReport) -> str:
    header = (
        "region",
        "group",
        "status",
        "graphs",
        "compile s",
        "breaks",
        "recompiles",
        "cache hits",
    )
    rows = [header] + [
        (
            r.path or "<root>",
            r.group,
            r.status + (" (reused)" if r.reused else ""),
            str(r.graphs),
            f"{r.compile_seconds:.2f}",
            str(r.graph_break_count),
            str(r.recompiles),
            str(r.cache_hits),
        )
        for r in report.regions
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [f"torchkiln compile report: backend={report.backend} selector={report.selector}"]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows]
    for r in report.regions:
        if r.fallback_reason:
            lines.append(f"  {r.path or '<root>'}: {r.fallback_reason}")
        if r.recompile_limit_hit:
            lines.append(
                f"  {r.path or '<root>'}: hit Dynamo's recompile limit; later calls run eagerly"
            )
    for group, reasons in report.later_recompiles.items():
        lines.append(
            f"  group {group}: {len(reasons)} compile(s) after the first calls: {reasons[-1]}"
        )
    return "\n".join(lines)
