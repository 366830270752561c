"""Read Dynamo's own compile records (counters and compilation metrics) for one window of
time, so the report states what torch measured rather than guesses."""

from __future__ import annotations

import collections
from typing import Any

import attrs

from torchkiln._internals import dynamo

RECOMPILE_LIMIT_MARKERS = ("recompile limit", "recompile_limit", "cache_size_limit")


@attrs.frozen
class CompileRecord:
    """One Dynamo frame compilation, reduced to what the report shows."""

    compile_id: str
    co_name: str
    seconds: float
    recompile_reason: str | None
    fail_reason: str | None
    cache_hits: int
    cache_misses: int
    restart_reasons: tuple[str, ...] = ()
    """Why Dynamo restarted this frame's analysis (a graph break restarts it once)."""

    @property
    def hit_recompile_limit(self) -> bool:
        text = f"{self.fail_reason or ''} {self.recompile_reason or ''}".lower()
        return any(marker in text for marker in RECOMPILE_LIMIT_MARKERS)


CACHES = ("inductor_fx_local", "inductor_fx_remote", "aotautograd_local", "aotautograd_remote")
"""The compile caches whose hit and miss counts Dynamo's compilation metrics carry."""


def _cache_count(metrics: Any, outcome: str) -> int:
    """Hits (``outcome="hit"``) or misses over :data:`CACHES` in one metrics record."""
    return sum(int(getattr(metrics, f"{cache}_cache_{outcome}_count", 0) or 0) for cache in CACHES)


def _record(metrics: Any) -> CompileRecord:
    return CompileRecord(
        compile_id=str(getattr(metrics, "compile_id", "") or ""),
        co_name=str(getattr(metrics, "co_name", "") or ""),
        seconds=float(getattr(metrics, "entire_frame_compile_time_s", 0.0) or 0.0),
        recompile_reason=getattr(metrics, "recompile_reason", None),
        fail_reason=getattr(metrics, "fail_reason", None),
        cache_hits=_cache_count(metrics, "hit"),
        cache_misses=_cache_count(metrics, "miss"),
        restart_reasons=tuple(sorted(getattr(metrics, "restart_reasons", None) or ())),
    )


def all_records(since: HeldRecords | None = None) -> list[CompileRecord]:
    """Every compilation Dynamo still remembers (it keeps the most recent ones only); with
    ``since``, only those recorded after that mark."""
    return [
        _record(m) for m in dynamo.compilation_metrics() if since is None or id(m) not in since.ids
    ]


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
class Window:
    """Counters and compile records between :meth:`open` and :meth:`close`."""

    _metrics_before: list[Any] = attrs.field(factory=list)
    _graphs_before: int = 0
    _breaks_before: collections.Counter[str] = attrs.field(factory=collections.Counter)

    @classmethod
    def open(cls) -> Window:
        counters = dynamo.counters()
        return cls(
            dynamo.compilation_metrics(),
            int(counters["stats"]["unique_graphs"]),
            collections.Counter(counters["graph_break"]),
        )

    def close(
        self, wrapper_code: str | None = None
    ) -> tuple[list[CompileRecord], int, dict[str, int]]:
        """New compile records, graphs compiled, and graph-break reasons with counts.

        ``wrapper_code`` names a frame that only calls the real forward (a region group's
        function). A graph break inside the forward also breaks that frame, at the call, before
        the forward is compiled as a frame of its own and breaks again: Dynamo counts the one
        break twice, so each break the wrapper frame restarted for is taken off once.
        """
        before_ids = {id(m) for m in self._metrics_before}
        new = [_record(m) for m in dynamo.compilation_metrics() if id(m) not in before_ids]
        counters = dynamo.counters()
        graphs = int(counters["stats"]["unique_graphs"]) - self._graphs_before
        breaks = collections.Counter(counters["graph_break"]) - self._breaks_before
        echoes = collections.Counter(
            reason
            for record in new
            if wrapper_code is not None and record.co_name == wrapper_code
            for reason in record.restart_reasons
        )
        return new, max(graphs, 0), dict(breaks - echoes)
