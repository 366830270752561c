"""The targets torchkiln promises (from the project's issues), checked against one bench run.

Each target is a ratio between two strategies' cells (or one strategy's warm and cold runs)
and a limit; the worst cell is judged. A target whose cells were not run (or failed) is
reported as not measured, never as met; one stated at depth 32 in a run without depth 32
shows its value as ``not judged``. docs/benchmarks.md says how the bench reports them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import attrs

from torchkiln.bench.results import CellResult

LARGE_DEPTHS = (16, 32)
STATED_AT_32 = " (the target is stated at depth 32)"

Pairs = list[tuple[str, float]]
"""``(where, ratio)`` of every cell a target is measured on."""


@attrs.frozen
class Target:
    """One promise, checked."""

    name: str
    met: bool | None
    """``None``: not measured in this run."""
    value: float | None
    limit: float
    detail: str

    @property
    def verdict(self) -> str:
        if self.met is None:
            return "not measured" if self.value is None else "not judged"
        return "met" if self.met else "NOT met"

    def to_dict(self) -> dict[str, object]:
        return attrs.asdict(self) | {"verdict": self.verdict}


class _Grid:
    def __init__(self, results: Iterable[CellResult]):
        self.cells = {(r.cell.depth, r.cell.batch, r.cell.strategy): r for r in results if r.ok}
        self.batches = sorted({b for _, b, _ in self.cells})
        self.depths = sorted({d for d, _, _ in self.cells if d is not None})

    def get(self, depth: int | None, batch: int, strategy: str) -> CellResult | None:
        return self.cells.get((depth, batch, strategy))

    def pairs(
        self, depths: Iterable[int | None], mine: str, theirs: str, number: str, their: str = ""
    ) -> Pairs:
        """``mine``'s ``number`` (a :class:`CellResult` attribute) over ``theirs``'s
        (``their``, default the same) in every batch at ``depths``."""
        pairs = []
        for depth in depths:
            for batch in self.batches:
                a, b = self.get(depth, batch, mine), self.get(depth, batch, theirs)
                if a and b:
                    ratio = _ratio(getattr(a, number), getattr(b, their or number))
                    if ratio is not None:
                        pairs.append((f"depth {depth} batch {batch}", ratio))
        return pairs


def verdict(value: float, limit: float) -> str:
    """``met`` when ``value`` is at most ``limit``, else ``NOT met`` (``--store``, ``--ranks``)."""
    return "met" if value <= limit else "NOT met"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _listed(digits: int) -> Callable[[Pairs], str]:
    return lambda pairs: ", ".join(f"{where}: {ratio:.{digits}f}x" for where, ratio in pairs)


def _worst_one(digits: int) -> Callable[[Pairs], str]:
    def detail(pairs: Pairs) -> str:
        where, ratio = max(pairs, key=lambda p: p[1])
        return f"worst: {where} {ratio:.{digits}f}x"

    return detail


def _judge(
    name: str,
    limit: float,
    pairs: Pairs,
    needs: str,
    detail: Callable[[Pairs], str],
    judged: bool = True,
) -> Target:
    """The worst of ``pairs`` against ``limit``; not measured (``needs``) without pairs; shown
    but not judged unless ``judged`` (the target is stated at a depth this run lacks)."""
    if not pairs:
        return Target(name, None, None, limit, needs)
    worst = max(ratio for _, ratio in pairs)
    if not judged:
        return Target(name, None, worst, limit, detail(pairs) + STATED_AT_32)
    return Target(name, worst <= limit, worst, limit, detail(pairs))


def _first_call_ratio(
    grid: _Grid,
    strategy: str,
    against: str,
    limit: float,
    name: str,
    depths: tuple[int, ...] = LARGE_DEPTHS,
) -> Target:
    pairs = grid.pairs(depths, strategy, against, "cold_first_call")
    needs = f"needs {strategy} and {against} at depth {' or '.join(map(str, depths))}"
    return _judge(name, limit, pairs, needs, _listed(2))


def _depth_scaling(grid: _Grid, limit: float) -> Target:
    name = "regional first call, depth 32 vs depth 4"
    needs = "needs regional at depth 4 and a deeper depth"
    if 4 not in grid.depths or len(grid.depths) < 2:
        return Target(name, None, None, limit, needs)
    deepest = max(grid.depths)
    pairs = []
    for batch in grid.batches:
        shallow, deep = grid.get(4, batch, "regional"), grid.get(deepest, batch, "regional")
        if shallow and deep:
            ratio = _ratio(deep.cold_first_call, shallow.cold_first_call)
            if ratio is not None:
                pairs.append((f"batch {batch}", ratio))

    def detail(pairs: Pairs) -> str:
        return f"depth {deepest} / depth 4: " + _listed(2)(pairs)

    return _judge(name, limit, pairs, needs, detail, judged=deepest == 32)


def _warm_vs_cold(grid: _Grid, strategy: str, limit: float) -> Target:
    """``strategy``'s warm start over its cold start, the worst cell judged."""
    pairs = [
        (f"depth {depth} batch {batch}", ratio)
        for (depth, batch, name), result in sorted(grid.cells.items(), key=str)
        if name == strategy
        and (ratio := _ratio(result.warm_first_call, result.cold_first_call)) is not None
    ]
    name = f"{strategy} warm start vs cold"
    return _judge(name, limit, pairs, f"needs warm runs of {strategy}", _worst_one(2))


def _steady_vs_full(
    grid: _Grid, strategy: str, limit: float, depths: list[int | None] | None = None, name: str = ""
) -> Target:
    wanted: list[int | None] = depths if depths is not None else ([*grid.depths] or [None])
    pairs = grid.pairs(wanted, strategy, "full", "steady")
    needs = f"needs {strategy} and full in the same cells"
    return _judge(name or f"{strategy} steady state vs full", limit, pairs, needs, _worst_one(3))


def _at_depth_32(
    grid: _Grid, name: str, limit: float, mine: tuple[str, str], theirs: tuple[str, str]
) -> Target:
    """``mine`` / ``theirs`` first call, each ``(strategy, "cold" | "warm")``, judged at depth
    32; at a shallower deepest depth the value is shown, not judged."""
    if not grid.depths:
        return Target(name, None, None, limit, f"needs {mine[0]} and {theirs[0]}")
    depth = 32 if 32 in grid.depths else max(grid.depths)
    first, their_first = f"{mine[1]}_first_call", f"{theirs[1]}_first_call"
    pairs = grid.pairs([depth], mine[0], theirs[0], first, their_first)
    needs = f"needs {mine[0]} and {theirs[0]} at depth {depth}"
    return _judge(name, limit, pairs, needs, _listed(3), judged=depth == 32)


def _tiered_targets(grid: _Grid) -> list[Target]:
    """Issue 21's targets: first call <= 1.1x regional cold at every depth; time to whole-model
    speed <= 1.2x full's cold first call; steady state after the switch <= 1.02x full at
    depths 16 and 32; and a precompiled cell that loaded the whole-model form against full."""
    first: Pairs = []
    to_whole: Pairs = []
    steady: Pairs = []
    loaded_first: Pairs = []
    loaded_steady: Pairs = []
    for (depth, batch, strategy), result in grid.cells.items():
        where = f"depth {depth} batch {batch}"
        regional, full = grid.get(depth, batch, "regional"), grid.get(depth, batch, "full")
        figures = (result.cold or {}).get("tiered")
        if strategy == "tiered" and figures is not None:
            whole = figures["seconds_to_whole_model"]
            if regional and regional.cold_first_call and result.cold_first_call:
                first.append((where, result.cold_first_call / regional.cold_first_call))
            if full and full.cold_first_call and whole:
                to_whole.append((where, whole / full.cold_first_call))
            if depth in LARGE_DEPTHS and full and full.steady and result.steady:
                steady.append((where, result.steady / full.steady))
        tiers = ((result.cold or {}).get("torchkiln_report") or {}).get("tiers") or {}
        if strategy == "precompiled" and full and tiers.get("serving") == "whole-model":
            if full.cold_first_call and result.cold_first_call:
                loaded_first.append((where, result.cold_first_call / full.cold_first_call))
            if full.steady and result.steady:
                loaded_steady.append((where, result.steady / full.steady))
    needs = "needs tiered with regional and full"
    judged = [
        ("tiered first call vs regional cold", 1.1, first),
        ("tiered time to whole-model speed vs full cold first call", 1.2, to_whole),
        ("tiered steady after the switch vs full (depth 16, 32)", 1.02, steady),
    ]
    if loaded_first or loaded_steady:
        judged += [
            ("whole-model artifact, new process: first call vs full cold", 0.1, loaded_first),
            ("whole-model artifact, new process: steady vs full", 1.02, loaded_steady),
        ]
    return [
        _judge(name, limit, pairs, needs, lambda pairs: _listed(3)(sorted(pairs)))
        for name, limit, pairs in judged
    ]


def check_targets(results: Iterable[CellResult], workload: str = "forward") -> list[Target]:
    """Every target of ``workload`` (issue 13 for ``forward``, issue 10 for ``generate``),
    judged on ``results``. The forward warm-start targets are regional <= 0.3x and
    hierarchical <= 0.2x of their cold start, each strategy judged by its own target only."""
    grid = _Grid(results)
    if workload == "generate":
        return [
            _first_call_ratio(
                grid, "regional", "full", 0.4,
                "regional time to first token vs full (depth 32)", (32,),
            ),
            _first_call_ratio(
                grid, "regional", "accelerate", 0.85,
                "regional time to first token vs accelerate compile_regions (depth 32)", (32,),
            ),
            _steady_vs_full(
                grid, "regional", 1.1, [32], "regional time per decoded token vs full (depth 32)"
            ),
            *_tiered_targets(grid),
        ]  # fmt: skip
    return [
        _first_call_ratio(
            grid, "regional", "full", 0.5, "regional first call vs full (depth 16, 32)"
        ),
        _first_call_ratio(
            grid, "regional", "accelerate", 1.0,
            "regional first call vs accelerate compile_regions (depth 16, 32)",
        ),
        _depth_scaling(grid, 1.2),
        _warm_vs_cold(grid, "regional", 0.3),
        _warm_vs_cold(grid, "hierarchical", 0.2),
        _steady_vs_full(grid, "hierarchical", 1.03),
        _steady_vs_full(grid, "regional", 1.02),
        _at_depth_32(
            grid, "hierarchical first call vs full (depth 32)", 0.45,
            ("hierarchical", "cold"), ("full", "cold"),
        ),
        _at_depth_32(
            grid, "precompiled first call vs regional cold (depth 32)", 0.1,
            ("precompiled", "cold"), ("regional", "cold"),
        ),
        _at_depth_32(
            grid, "precompiled first call vs regional warm (depth 32)", 0.5,
            ("precompiled", "cold"), ("regional", "warm"),
        ),
        *_tiered_targets(grid),
    ]  # fmt: skip


def missed(targets: Iterable[Target]) -> list[Target]:
    """The targets this run judged and found NOT met."""
    return [t for t in targets if t.met is False]
