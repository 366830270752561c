"""An independent witness for the report: the profiler's ``Torch-Compiled Region`` ranges.

Dynamo opens a ``Torch-Compiled Region: <compile id>`` range around each run of a cached graph
(through its own frame evaluation, the path every block call takes). Each block call is wrapped in a range of its own by forward
hooks (outside the compiled code), so a block call ran compiled when a compiled-region range
lies inside it. Nothing of torchkiln is used to count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch
from torch import nn

from torchkiln.engine.compile_state import region_state_of

_PREFIX = "torchkiln-witness block "


@attrs.frozen
class BlockCalls:
    calls: int
    compiled: int

    @property
    def eager(self) -> int:
        return self.calls - self.compiled


def _hooks(blocks: Sequence[nn.Module]) -> list[Any]:
    handles = []
    for index, block in enumerate(blocks):

        def enter(module: nn.Module, args: Any, index: int = index) -> None:
            scope = torch.profiler.record_function(f"{_PREFIX}{index}")
            scope.__enter__()
            module.__dict__.setdefault("_witness_scopes", []).append(scope)

        def leave(module: nn.Module, args: Any, output: Any) -> None:
            module.__dict__["_witness_scopes"].pop().__exit__(None, None, None)

        handles.append(block.register_forward_pre_hook(enter))
        handles.append(block.register_forward_hook(leave))
    return handles


def profiled_block_calls(blocks: Sequence[nn.Module], run: Callable[[], Any]) -> list[BlockCalls]:
    """Per block: how many calls ``run()`` made, and how many of them ran compiled code."""
    handles = _hooks(blocks)
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            run()
    finally:
        for handle in handles:
            handle.remove()
    events = list(prof.events())
    compiled = [e.time_range for e in events if e.name.startswith("Torch-Compiled Region")]
    found = [BlockCalls(0, 0) for _ in blocks]
    for event in events:
        if not event.name.startswith(_PREFIX):
            continue
        index = int(event.name.removeprefix(_PREFIX))
        span = event.time_range
        inside = any(span.start <= c.start and c.end <= span.end for c in compiled)
        found[index] = BlockCalls(found[index].calls + 1, found[index].compiled + inside)
    return found


def assert_report_agrees(report: Any, blocks: Sequence[nn.Module], seen: list[BlockCalls]) -> None:
    """Every region's eager calls and status are what the profiler saw for its block."""
    by_path = {r.path: r for r in report.regions}
    paths = [region_state_of(b).region.path for b in blocks]  # type: ignore[union-attr]
    said = [(p, by_path[p].eager_calls, by_path[p].status) for p in paths]
    witnessed = [(p, s.eager, "compiled" if s.eager == 0 else "eager") for p, s in zip(paths, seen)]
    assert said == witnessed
