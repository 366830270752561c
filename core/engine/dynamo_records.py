"""Dynamo's own records of each compile, and which region each compile ran for.

:class:`Window` reads Dynamo's counters and compilation metrics between two moments, so the
report states what torch measured rather than guesses. The region a later compile ran for is
recorded when it starts (``torch._dynamo.callback_handler``'s start callbacks, given the compile
id): the frame being compiled is then an argument of Dynamo's ``_compile`` on the stack, and
when its code is a region group's function, its ``module`` local is the region. The observer
is installed when a model is compiled (``torch._dynamo.reset()`` drops it until the next
compile), costs nothing on calls that hit Dynamo's cache and never raises into Dynamo. Eager
runs are counted by the group's function itself
(:func:`torchkiln.engine.compile_state.ran_eagerly`); no log is read.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from types import CodeType
from typing import Any

import attrs

from torchkiln._internals import cache_entries, dynamo

RECOMPILE_LIMIT_MARKERS = ("recompile limit", "recompile_limit", "cache_size_limit")
GROUP_CODE_PREFIX = "torchkiln_"

# --- Dynamo's compile records --------------------------------------------------------------


@attrs.frozen
class CompileRecord:
    """One Dynamo frame compilation, reduced to what the report shows."""

    compile_id: str
    co_name: str
    seconds: float
    recompile_reason: str | None
    fail_reason: str | None
    cache_hits: int
    restart_reasons: tuple[str, ...] = ()
    """Why Dynamo restarted this frame's analysis (a graph break restarts it once)."""

    @property
    def hit_recompile_limit(self) -> bool:
        text = f"{self.fail_reason or ''} {self.recompile_reason or ''}".lower()
        return any(marker in text for marker in RECOMPILE_LIMIT_MARKERS)


CACHES = ("inductor_fx_local", "inductor_fx_remote", "aotautograd_local", "aotautograd_remote")
"""The compile caches whose hit counts Dynamo's compilation metrics carry."""


def all_records(since: HeldRecords | None = None) -> list[CompileRecord]:
    """Every compilation Dynamo still remembers (it keeps the most recent ones only); with
    ``since``, only those recorded after that mark.

    Written out in one function (loops, not comprehensions or helpers, which would each be a
    frame): it runs at the end of every region's first call."""
    records = []
    for metrics in dynamo.compilation_metrics():
        if since is not None and id(metrics) in since.ids:
            continue
        if id(metrics) in _TRACED_ONLY.ids:
            continue
        cache_hits = 0
        for cache in CACHES:
            cache_hits += int(getattr(metrics, f"{cache}_cache_hit_count", 0) or 0)
        record = CompileRecord(
            compile_id=str(getattr(metrics, "compile_id", "") or ""),
            co_name=str(getattr(metrics, "co_name", "") or ""),
            seconds=float(getattr(metrics, "entire_frame_compile_time_s", 0.0) or 0.0),
            recompile_reason=getattr(metrics, "recompile_reason", None),
            fail_reason=getattr(metrics, "fail_reason", None),
            cache_hits=cache_hits,
            restart_reasons=tuple(sorted(getattr(metrics, "restart_reasons", None) or ())),
        )
        records.append(record)
    return records


@attrs.frozen
class HeldRecords:
    """The compilation records Dynamo held at one moment. Compile ids restart after
    ``torch._dynamo.reset()``, so records are told apart by identity; the mark holds them,
    so no later record can reuse an id."""

    held: tuple[Any, ...] = attrs.field(repr=False)
    ids: frozenset[int] = attrs.field(repr=False)

    @classmethod
    def now(cls) -> HeldRecords:
        held = tuple(dynamo.compilation_metrics())
        return cls(held, frozenset(map(id, held)))

    def __deepcopy__(self, memo: dict[int, Any]) -> HeldRecords:
        return self  # the same records before a copy as before its original


@attrs.define
class _TracedOnly:
    """Dynamo's records and graph count of traces that compiled nothing (:func:`traced_only`);
    the records are held, so that no later record can reuse one's id."""

    held: list[Any] = attrs.Factory(list)
    ids: set[int] = attrs.Factory(set)
    graphs: int = 0


_TRACED_ONLY = _TracedOnly()


@contextlib.contextmanager
def traced_only() -> Iterator[None]:
    """Dynamo work in the block that compiles nothing (a job's rank-invariance trace: the
    backend stops at the graph): its records and graphs are left out of every report, so a
    region's counts stay those of its compiles."""
    before = HeldRecords.now()
    graphs = int(dynamo.counters()["stats"]["unique_graphs"])
    try:
        yield
    finally:
        _TRACED_ONLY.graphs += int(dynamo.counters()["stats"]["unique_graphs"]) - graphs
        for metrics in dynamo.compilation_metrics():
            if id(metrics) not in before.ids and id(metrics) not in _TRACED_ONLY.ids:
                _TRACED_ONLY.held.append(metrics)
                _TRACED_ONLY.ids.add(id(metrics))


@attrs.define
class Window:
    """Counters and compile records between :meth:`open` and :meth:`close_into`, around a
    region's first call (each step written out here, not in helpers: it is on that path)."""

    _records_before: HeldRecords
    _graphs_before: int
    _breaks_before: collections.Counter[str]
    _traced_before: int = 0

    @classmethod
    def open(cls) -> Window:
        """The window, from now; the compile observer installed again first (as
        :func:`install`: ``torch._dynamo.reset()`` may have dropped it)."""
        with _lock:
            cache_entries.on_compile(_on_compile_start, _on_compile_end)
        counters = dynamo.counters()
        held = tuple(dynamo.compilation_metrics())
        return cls(
            HeldRecords(held, frozenset(map(id, held))),
            int(counters["stats"]["unique_graphs"]),
            collections.Counter(counters["graph_break"]),
            _TRACED_ONLY.graphs,
        )

    def close_into(self, region: Any, wrapper_code: str) -> None:
        """Add the new compile records, graphs compiled, and graph-break reasons with counts to
        ``region`` (a :class:`~torchkiln.engine.compile_state.RegionState`: its ``records``,
        ``graphs`` and ``graph_breaks``).

        ``wrapper_code`` names a frame that only calls the real forward (a region group's
        function). A graph break inside the forward also breaks that frame, at the call, before
        the forward is compiled as a frame of its own and breaks again: Dynamo counts the one
        break twice, so each break the wrapper frame restarted for is taken off once.
        """
        new = all_records(self._records_before)
        counters = dynamo.counters()
        graphs = int(counters["stats"]["unique_graphs"]) - self._graphs_before
        graphs -= _TRACED_ONLY.graphs - self._traced_before
        breaks = collections.Counter(counters["graph_break"]) - self._breaks_before
        for record in new:
            if record.co_name == wrapper_code:
                breaks.subtract(record.restart_reasons)
        region.records.extend(new)
        region.graphs += max(graphs, 0)
        for reason, count in breaks.items():
            if count > 0:
                region.graph_breaks[reason] = region.graph_breaks.get(reason, 0) + count


# --- which region each compile ran for -----------------------------------------------------


@attrs.define(eq=False)
class CompileEvent:
    """One compile (or limit hit) of a group function, and the region it ran for."""

    compile_id: str
    group_code: str
    """The group function's ``co_name`` (a resume function maps to its group's)."""
    module: weakref.ref[Any] | None


_lock = threading.Lock()
_by_compile_id: dict[tuple[str, str], CompileEvent] = {}
"""(group code, compile id) -> event: compile ids restart after ``torch._dynamo.reset()``,
group code names never repeat in a process."""


def group_code_of(co_name: str) -> str | None:
    """The group function a code name belongs to (itself, or a resume function in it)."""
    co_name = cache_entries.resumed_function_name(co_name)
    return co_name if co_name.startswith(GROUP_CODE_PREFIX) else None


def _on_compile_start(compile_id: str) -> None:
    try:
        found = cache_entries.frame_being_compiled()
        if found is None:
            return
        group = found[0].co_name
        if not group.startswith(GROUP_CODE_PREFIX):  # a resume function in a group function?
            group = cache_entries.resumed_function_name(group)  # as group_code_of
            if not group.startswith(GROUP_CODE_PREFIX):
                return
        module = found[1].get("module")  # the region (a group function's first argument)
        event = CompileEvent(compile_id, group, weakref.ref(module) if module is not None else None)
        with _lock:
            _by_compile_id[(group, compile_id)] = event
            factories = _trace_settings.get(group)
        if factories:
            stack = contextlib.ExitStack()
            _entered.append(stack)  # closed at the compile's end, entered or not
            for factory in factories:
                stack.enter_context(factory())
    except Exception:  # an observer never breaks a compile
        return


def _on_compile_end(compile_id: str) -> None:
    while _entered:  # only the outermost compile calls the observer: one at a time
        _entered.pop().close()


# --- the settings a group's code is traced in --------------------------------------------------

_trace_settings: dict[str, list[Callable[[], AbstractContextManager[Any]]]] = {}
"""Group code name -> its preparations' ``trace_settings`` factories."""
_entered: list[contextlib.ExitStack] = []


def trace_while_compiling(
    group_code: str, factories: list[Callable[[], AbstractContextManager[Any]]]
) -> None:
    """Enter ``factories``' contexts (first outermost) whenever Dynamo compiles group code
    ``group_code`` (its function, or a resume function in it), from the compile's start to its
    end: ``GroupPreparation.trace_settings`` hold while Dynamo traces, and a call that runs
    compiled code pays nothing for them (they were a context entered on every call)."""
    with _lock:
        _trace_settings[group_code] = list(factories)


@contextlib.contextmanager
def trace_settings_entered(group_code: str) -> Iterator[None]:
    """The settings :func:`trace_while_compiling` holds for ``group_code``, entered for a trace
    made by other means than a Dynamo compile (``aot_compile`` while precompiling)."""
    with _lock:
        factories = list(_trace_settings.get(group_code, ()))
    with contextlib.ExitStack() as stack:
        for factory in factories:
            stack.enter_context(factory())
        yield


def install() -> None:
    """Install the observer (again whenever ``torch._dynamo.reset()``, which clears Dynamo's
    callbacks, dropped it)."""
    with _lock:
        cache_entries.on_compile(_on_compile_start, _on_compile_end)


def event_for(group_code: str, compile_id: str) -> CompileEvent | None:
    with _lock:
        return _by_compile_id.get((group_code, compile_id))


def forget(group_codes: set[str]) -> None:
    """Drop what was recorded for these groups (their model was decompiled)."""
    with _lock:
        for key in [k for k, e in _by_compile_id.items() if e.group_code in group_codes]:
            del _by_compile_id[key]
        for code in group_codes:
            _trace_settings.pop(code, None)


def failed_guards_and_count(code: CodeType, frame_locals: dict[str, Any]) -> tuple[list[str], int]:
    """For each of Dynamo's cached entries for ``code``, the first guard a call with these
    locals fails (Dynamo's own "last reason" names only one entry's), and how many cached
    entries ``code`` has."""
    try:
        entries = cache_entries.dynamo_guard_table(code, lambda entry_code: entry_code)
    except Exception:
        return [], 0
    failures = entries.first_failures(frame_locals, unexplained=None)
    return [failed.strip() for failed in failures if failed is not None], len(entries)
