"""``torchkiln.report(model)``: per region, what Dynamo compiled and what it cost, on every call.

The first call of each region is measured by its first-call shim (a window over Dynamo's
records). Everything after that is read lazily, when the report is built: Dynamo's compilation
metrics and the region each of those compiles ran for (:mod:`torchkiln.engine.dynamo_records`).
Whether a region ran compiled is never re-derived when the report is read nor taken from a
log: the region's own code counts each call that runs it eagerly
(:func:`torchkiln.engine.compile_state.ran_eagerly`), and a region is ``compiled`` when no call
of it ran eagerly. Every reason is one line, identical lines grouped with a count, a known
cause named with its remedy (:mod:`torchkiln.plugin_host.report_causes`); Dynamo's full text
is kept for ``report(verbose=True)``. docs/guide.md ("The report") describes every field.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from torchkiln.engine import dynamo_records
from torchkiln.engine.compile_state import CompileState, RegionState
from torchkiln.engine.dynamo_records import CompileRecord, all_records
from torchkiln.engine.serving import call_families
from torchkiln.engine.states import State
from torchkiln.plugin_host.report_causes import BUILTIN_CAUSES, ReportCause, match_cause

FIRST_CALLS = "first calls"
LATER_CALLS = "later calls"
_COMPILE_ID_PREFIX = re.compile(r"^\s*(\[?\d+/\d+\]?:?\s*)+")
_MAX_LINE = 200
_SOURCE_COMMENT = re.compile(r"\s{2,}#.*$")


def one_line(text: str | None) -> str:
    """The first meaningful line of a Dynamo reason, without the ``0/7:`` compile-id prefix."""
    for line in (text or "").splitlines():
        line = _SOURCE_COMMENT.sub("", _COMPILE_ID_PREFIX.sub("", line)).strip()
        if line:
            return line if len(line) <= _MAX_LINE else line[: _MAX_LINE - 3] + "..."
    return ""


@attrs.frozen
class Reason:
    """One line of the report: a recompile, a graph break, a limit hit or a fallback."""

    kind: str
    """``guard`` (a recompile), ``recompile limit``, ``graph break``, ``eager``, ``failed``."""
    text: str
    """One line: the guard that failed, the break, why the region runs eagerly."""
    phase: str
    """``first calls`` or ``later calls``."""
    count: int = 1
    cause: str | None = None
    """The named cause it matches (``a specialised int/float attribute``), if any."""
    remedy: str | None = None
    full: str = ""
    """Dynamo's full text (shown by ``report(verbose=True)``)."""


@attrs.frozen
class RegionReport:
    """One region after its first call."""

    path: str
    group: str
    status: str
    """A :class:`~torchkiln.engine.states.State` word: ``serving`` (its group's code came from
    a source: the store, a peer rank, an artifact directory), ``compiled``, ``eager`` (fell
    back, or ran eagerly on later calls), ``failed``, or ``pending`` (not called yet)."""
    graphs: int
    """Graphs Dynamo compiled during this region's first call (0 when it reused its group's)."""
    compile_seconds: float
    """What this run spent compiling for this region: Dynamo's own compile time for its graphs,
    plus, for the region whose first call compiled its group's shared entry (``job``/``store``),
    that compile's time where Dynamo's records miss it (its ``aot_compile``)."""
    first_call_seconds: float | None
    graph_breaks: dict[str, int]
    recompiles: int
    recompile_reasons: tuple[str, ...]
    cache_hits: int
    """Inductor FX-graph and AOTAutograd cache hits while compiling this region."""
    reused: bool
    """The region ran its group's code, compiled or loaded by another region of the group (a
    Dynamo cache hit, or the loaded function's saved guards passing)."""
    fallback_reason: str | None
    recompile_limit_hit: bool
    """This region's own calls hit Dynamo's recompile limit (first or later calls)."""
    later_graphs: int = 0
    """Graphs compiled for this region after its first call (new shapes, dtypes, modes)."""
    later_graph_breaks: dict[str, int] = attrs.Factory(dict)
    reasons: tuple[Reason, ...] = ()
    """Every reason about this region, one line each, identical ones counted once."""
    eager_calls: int = 0
    """Calls whose region code ran eagerly, not compiled (first call included): counted by the
    region's own code when it runs without Dynamo's compiled code, never re-derived."""
    loaded_from: str | None = None
    """Where its group's code was loaded from instead of compiled in this run (``store``,
    ``rank 0``, ``artifacts DIR``), on the region whose first call loaded it; else ``None``."""
    load_seconds: float | None = None
    """What loading its group's code took on that region (also after compiling a shared entry,
    which every rank loads); ``None`` where nothing was loaded."""

    @property
    def graph_break_count(self) -> int:
        return sum(self.graph_breaks.values())

    @property
    def graphs_by_phase(self) -> dict[str, int]:
        return {FIRST_CALLS: self.graphs, LATER_CALLS: self.later_graphs}


@attrs.frozen
class CompileReport:
    """What :func:`torchkiln.report` returns. ``str()`` renders a table."""

    backend: str
    selector: str
    reason: str
    regions: tuple[RegionReport, ...]
    eager: tuple[tuple[str, str], ...]
    later_recompiles: dict[str, tuple[str, ...]]
    """Compiles after the first calls (new shapes, say), by group, one line each."""
    verbose: bool = False
    """``str()`` shows Dynamo's full text under each reason."""
    causes: tuple[ReportCause, ...] = attrs.field(default=(), repr=False)
    tiers: Any = None
    """Tiered compilation: which tier serves, calls per tier, the switch, the build
    (:class:`torchkiln.tiered.tier_report.TierReport`); ``None`` without tiers."""
    remote_cache: Any = None
    """``remote_cache``: torch's remote-cache traffic since compile and whether the server
    answers (:class:`torchkiln.artifacts.remote_cache.RemoteCacheReport`)."""
    served_from: tuple[str, ...] = ()
    """Per group served by a source's code (the store, a peer rank, a precompiled directory):
    ``pending`` before its first call, else where the code came from, the calls it served and
    those the backend compiled (or ``compiled``: no source had code for it)."""
    notes: tuple[str, ...] = ()
    """What runs outside the compiled code and why, one line each: group preparations'
    notes (Accelerate's device hooks, prefixed with the group) and LoRA layers outside the
    repeated blocks."""
    job: Any = None
    """Compiling once per job: what each group's first call did on this rank
    (:class:`torchkiln.jobs.share.JobReport`); ``None`` outside a job."""
    backend_plugin: str | None = None
    """The plugin whose ``compile_region`` compiled the regions (``torch``: a backend only
    torch's registry knows, compiled with ``torch.compile``)."""
    selector_plugin: str | None = None
    """The plugin whose ``select_regions`` chose the regions."""
    frozen: str | None = None
    """Serving mode (``torchkiln.freeze``): its policy and the calls no compiled form covered
    since, by group; ``None`` when not frozen."""
    covers: tuple[str, ...] = ()
    """The call families each compiled form admits, read from its guards (each group's
    compiled entries, the entries a source loaded, the whole-model form); ``str()`` shows them
    when frozen or verbose."""

    @property
    def title(self) -> str:
        """``torchkiln compile report: backend X (plugin P), selector Y (plugin Q)``."""
        backend = _by(self.backend, self.backend_plugin)
        return f"torchkiln compile report: backend {backend}, selector {_by(self.selector, self.selector_plugin)}"

    @property
    def total_graphs(self) -> int:
        return sum(r.graphs for r in self.regions)

    @property
    def total_compile_seconds(self) -> float:
        return sum(r.compile_seconds for r in self.regions)

    @property
    def total_load_seconds(self) -> float:
        return sum(r.load_seconds or 0.0 for r in self.regions)

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self, recurse=True, filter=lambda a, _: a.name != "causes") | {
            "total_graphs": self.total_graphs,
            "total_compile_seconds": self.total_compile_seconds,
            "total_load_seconds": self.total_load_seconds,
        }

    def __str__(self) -> str:
        from torchkiln.reporting.report_table import render_report

        return render_report(self)


def _by(name: str, plugin: str | None) -> str:
    return f"{name} (plugin {plugin})" if plugin else name


@attrs.define
class _Later:
    """What Dynamo did for one region after its first call, and how its calls ran."""

    records: list[CompileRecord] = attrs.Factory(list)
    limit_hit: CompileRecord | None = None
    """The group's recompile-limit hit, when this region's call was the one that hit it."""
    limit_phase: str = LATER_CALLS
    affected_by: str | None = None
    """Path of the region whose call hit the group's limit, when this region ran eagerly too."""
    still_compiled_after: str | None = None
    """Path of the region whose call hit the group's limit, when this region never ran
    eagerly (every call found a cached graph)."""


@attrs.frozen
class _GroupSource:
    """How a group served by a source's code got it, beyond what Dynamo's records say."""

    region: str
    """The region whose first call compiled or loaded the group's code."""
    compiled_seconds: float = 0.0
    """Compile time Dynamo's frame records do not hold (a shared entry's ``aot_compile``)."""
    loaded_from: str | None = None
    """Where the code came from when this run did not compile it."""
    load_seconds: float | None = None


def _group_sources(state: CompileState) -> dict[str, _GroupSource]:
    """Group -> how its code came to this run, for each group a source served."""
    shares = getattr(state.job, "groups", None)
    found: dict[str, _GroupSource] = {}
    for group, code in state.group_codes.items():
        if code.loaded is None:  # not called yet, or the backend compiled it
            continue
        share = shares.get(group) if isinstance(shares, dict) else None
        if share is not None and share.role != "local":
            found[group] = _from_job(share, code.loaded.source, _first_region(state, group))
        else:
            found[group] = _from_source(code, _first_region(state, group))
    return found


def _first_region(state: CompileState, group: str) -> str:
    return next((s.region.path for s in state.regions if s.region.group == group), "")


def _from_job(share: Any, source: str, first_region: str) -> _GroupSource:
    region = share.region or first_region
    if share.role == "compiled":  # compiled here, then loaded like every other rank does
        unrecorded = max(share.compile_seconds - share.recorded_compile_seconds, 0.0)
        return _GroupSource(region, unrecorded, None, share.load_seconds)
    return _GroupSource(region, 0.0, source, share.load_seconds)


def _from_source(code: Any, first_region: str) -> _GroupSource:
    """A source that loaded before any call (``artifacts=``): its own load time, if it kept one."""
    source = code.loaded.source
    seconds = next(
        (
            s.load_seconds.get(code.group.name)
            for s in code.sources
            if getattr(s, "name", None) == source
            and isinstance(getattr(s, "load_seconds", None), dict)
        ),
        None,
    )
    return _GroupSource(first_region, 0.0, source, seconds)


def _region_report(
    state: RegionState,
    later: _Later,
    causes: Sequence[ReportCause],
    source: _GroupSource | None = None,
) -> RegionReport:
    records: list[CompileRecord] = state.records
    reasons = tuple(r.recompile_reason for r in records if r.recompile_reason)
    status, fallback = state.status, state.fallback_reason
    if status in (State.COMPILED, State.SERVING) and state.eager_calls:
        # The witness: the group's function ran without compiled code for this region.
        status, fallback = State.EAGER, _eager_reason(state, later)
    later_breaks = _breaks(later.records)
    lines = _reasons(state, later, later_breaks, status, fallback, causes)
    if source is not None and source.region != state.region.path:
        source = None  # another region of the group compiled or loaded its code
    compiled_seconds = source.compiled_seconds if source is not None else 0.0
    return RegionReport(
        path=state.region.path,
        group=state.region.group,
        status=status,
        graphs=state.graphs,
        compile_seconds=round(sum(r.seconds for r in records) + compiled_seconds, 6),
        first_call_seconds=state.first_call_seconds,
        graph_breaks=dict(state.graph_breaks),
        recompiles=len(reasons),
        recompile_reasons=tuple(one_line(r) for r in reasons),
        cache_hits=sum(r.cache_hits for r in records),
        reused=status in (State.COMPILED, State.SERVING) and not records and source is None,
        fallback_reason=fallback,
        recompile_limit_hit=later.limit_hit is not None,
        later_graphs=sum(1 for r in later.records if not r.fail_reason),
        later_graph_breaks=later_breaks,
        reasons=lines,
        eager_calls=state.eager_calls,
        loaded_from=source.loaded_from if source is not None else None,
        load_seconds=source.load_seconds if source is not None else None,
    )


def _eager_reason(state: RegionState, later: _Later) -> str:
    """Why a region's code ran eagerly, from what its first eager call saw."""
    group = state.region.group
    when = " on a later call" if later.limit_phase == LATER_CALLS else ""
    if later.limit_hit is not None:
        return (
            f"hit Dynamo's recompile limit in group {group!r}{when}; calls like that one run "
            "eagerly here"
        )
    if later.affected_by is not None:
        return (
            f"Dynamo's recompile limit was hit in group {group!r} (at {later.affected_by}"
            f"{when}); calls that no cached graph fits run eagerly here"
        )
    run = state.first_eager
    if run is not None and run.stance != "default":
        return f"ran eagerly under torch.compiler.set_stance({run.stance!r})"
    return "Dynamo ran this region's code without compiled code (a skipped or disabled frame)"


def _breaks(records: Iterable[CompileRecord]) -> dict[str, int]:
    breaks: dict[str, int] = {}
    for record in records:
        for reason in record.restart_reasons:
            line = one_line(reason)
            breaks[line] = breaks.get(line, 0) + 1
    return breaks


def _reason(
    kind: str, full: str, phase: str, causes: Sequence[ReportCause], count: int = 1
) -> Reason:
    text = one_line(full)
    cause = match_cause("graph break" if kind == "graph break" else "guard", (text, full), causes)
    return Reason(
        kind,
        text,
        phase,
        count,
        cause.name if cause else None,
        cause.remedy if cause else None,
        full if "\n" in full.strip() else "",
    )


def _reasons(
    state: RegionState,
    later: _Later,
    later_breaks: dict[str, int],
    status: str,
    fallback: str | None,
    causes: Sequence[ReportCause],
) -> tuple[Reason, ...]:
    found = [
        _reason("graph break", r, FIRST_CALLS, causes, n) for r, n in state.graph_breaks.items()
    ]
    for phase, phase_records in ((FIRST_CALLS, state.records), (LATER_CALLS, later.records)):
        found += [
            _reason("guard", r.recompile_reason, phase, causes)
            for r in phase_records
            if r.recompile_reason and not r.hit_recompile_limit
        ]
    found += [_reason("graph break", r, LATER_CALLS, causes, n) for r, n in later_breaks.items()]
    if later.limit_hit is not None:
        found.append(_limit_reason(state, later, causes))
    if status in ("eager", "failed") and fallback:
        phase = later.limit_phase if state.eager_calls else FIRST_CALLS
        found.append(Reason(status, one_line(fallback), phase, full=fallback))
    elif later.still_compiled_after is not None:
        found.append(
            Reason(
                "compiled",
                f"the recompile limit was hit at {later.still_compiled_after}; every call here "
                "still ran compiled code (no eager run counted)",
                later.limit_phase,
            )
        )
    return _merge(found)


def _limit_reason(state: RegionState, later: _Later, causes: Sequence[ReportCause]) -> Reason:
    """The limit hit, with the guard each cached graph failed at that call (Dynamo names only
    one), as the call saw it."""
    hit = later.limit_hit
    full = (hit.fail_reason or hit.recompile_reason or "") if hit is not None else ""
    run = state.first_eager
    distinct = list(dict.fromkeys(run.failed_guards)) if run is not None else []
    full = "\n".join([full, *distinct] if full else distinct)
    reason = _reason("recompile limit", full or "recompile limit hit", later.limit_phase, causes)
    if distinct and run is not None:
        reason = attrs.evolve(
            reason,
            text=one_line(
                f"no cached graph fits ({run.cached} cached): " + "; ".join(distinct[:3])
            ),
        )
    return reason


def _merge(reasons: Iterable[Reason]) -> tuple[Reason, ...]:
    merged: dict[tuple[str, str, str], Reason] = {}
    for reason in reasons:
        key = (reason.kind, reason.text, reason.phase)
        if key in merged:
            reason = attrs.evolve(merged[key], count=merged[key].count + reason.count)
        merged[key] = reason
    return tuple(merged.values())


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


def _later_records(state: CompileState) -> dict[str, list[CompileRecord]]:
    """Group -> its compile records after the first calls, oldest first.

    Dynamo keeps only its most recent compilation metrics, so what each report saw is kept
    on the model's state: a report after many recompiles still lists the earlier ones it saw.
    """
    seen = {r.compile_id for s in state.regions for r in s.records}
    own_frames = _own_frames(state)
    for record in all_records(since=state.records_before):
        if record.compile_id in seen or record.compile_id in state.later_records:
            continue
        group = next(
            (
                g
                for g, code in state.code_names.items()
                if _is_own(record, code, own_frames.get(g, set()))
            ),
            None,
        )
        if group is not None:
            state.later_records[record.compile_id] = (group, record)
    by_group: dict[str, list[CompileRecord]] = {}
    for group, record in state.later_records.values():
        by_group.setdefault(group, []).append(record)
    return by_group


def _attribute_later(
    state: CompileState, by_group: dict[str, list[CompileRecord]]
) -> dict[int, _Later]:
    """Region (by id of its state) -> what happened to it after its first call."""
    later: dict[int, _Later] = {id(s): _Later() for s in state.regions}
    by_module = {id(s.module): s for s in state.regions if s.module is not None}
    for group, records in by_group.items():
        code_name = state.code_names.get(group, "")
        for record in records:
            event = dynamo_records.event_for(
                dynamo_records.group_code_of(record.co_name) or code_name, record.compile_id
            )
            module = event.module() if event is not None and event.module else None
            owner = by_module.get(id(module)) if module is not None else None
            if owner is not None:
                later[id(owner)].records.append(record)
    _attribute_limit_hits(state, by_group, later)
    return later


def _attribute_limit_hits(
    state: CompileState, by_group: dict[str, list[CompileRecord]], later: dict[int, _Later]
) -> None:
    """A group's recompile-limit hit (Dynamo's own record, first or later calls) belongs to the
    region whose eager run came first: the call that hit the limit ran eagerly. The group's
    other regions either ran eagerly too (affected) or never did (still compiled)."""
    own_frames = _own_frames(state)
    for group, code in state.code_names.items():
        frames = own_frames.get(group, set())
        members = [s for s in state.regions if s.region.group == group]
        first = [
            r
            for s in members
            for r in s.records
            if r.hit_recompile_limit and _is_own(r, code, frames)
        ]
        hits = first + [r for r in by_group.get(group, []) if r.hit_recompile_limit]
        eager = [s for s in members if s.first_eager is not None]
        if not hits or not eager:
            continue
        at = min(eager, key=lambda s: s.first_eager.order if s.first_eager else 0)
        phase = FIRST_CALLS if first else LATER_CALLS
        later[id(at)].limit_hit = hits[-1]
        for region_state in members:
            later[id(region_state)].limit_phase = phase
            if region_state is at:
                continue
            if region_state.eager_calls:
                later[id(region_state)].affected_by = at.region.display_path
            elif phase == LATER_CALLS and region_state.status in ("compiled", "serving"):
                later[id(region_state)].still_compiled_after = at.region.display_path


def build_report(
    state: CompileState, *, verbose: bool = False, causes: Sequence[ReportCause] = ()
) -> CompileReport:
    all_causes = (*causes, *BUILTIN_CAUSES)
    by_group = _later_records(state)
    later = _attribute_later(state, by_group)
    sources = _group_sources(state)
    return CompileReport(
        backend=state.config.backend,
        selector=state.plan.selector,
        reason=state.plan.reason,
        regions=tuple(
            _region_report(s, later[id(s)], all_causes, sources.get(s.region.group))
            for s in state.regions
        ),
        eager=tuple((e.path, e.reason) for e in state.plan.eager),
        later_recompiles={
            group: tuple(one_line(r.recompile_reason or r.fail_reason) or "compiled" for r in rs)
            for group, rs in by_group.items()
        },
        verbose=verbose,
        causes=all_causes,
        tiers=state.tiered.report() if state.tiered is not None else None,
        # a live share reports itself; a decision not to share is its own report
        job=state.job.report() if hasattr(state.job, "report") else state.job,
        served_from=tuple(code.line() for code in state.group_codes.values()),
        notes=tuple(state.notes),
        remote_cache=state.remote_cache.report() if state.remote_cache is not None else None,
        backend_plugin=state.providers.get("backend"),
        selector_plugin=state.providers.get("selector"),
        frozen=state.frozen.line() if state.frozen is not None else None,
        covers=call_families(state),
    )
