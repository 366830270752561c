"""The rank-invariance check's trace (:mod:`torchkiln.jobs.traced_graph`), in one process: the
digest follows what Dynamo baked into the graph, equal for equal code, and the trace is no
compile in the report's counts. The two-rank test is ``tests/distributed/test_jobs.py``
(``test_a_rank_read_while_tracing_is_caught_by_the_graph_and_the_rest_still_shared``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from torchkiln._internals import dynamo
from torchkiln.engine.dynamo_records import Window
from torchkiln.engine.group_runtime import GroupCall
from torchkiln.jobs.traced_graph import first_difference, trace_group

# The check traces with aot_compile, as a job shares (torch 2.13 on; before, no rank shares).
pytestmark = pytest.mark.needs_feature("precompiled artifacts")

SCALE = 2
"""Read by the block's forward while Dynamo traces: an int Dynamo bakes into the graph, guarded
only by a guard on a global (which ``aot_compile`` drops), with no attribute a key could see."""


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x).relu() * SCALE


def group_function(module: nn.Module, /, *args: Any, **kwargs: Any) -> Any:
    return type(module).forward(module, *args, **kwargs)


def _call(block: nn.Module) -> GroupCall:
    return GroupCall(
        group=None,  # type: ignore[arg-type]  # not read by the trace
        shared=group_function,
        module=block,
        args=(torch.ones(2, 4),),
        kwargs={},
        build_savable=lambda dynamic=None: group_function,
        code=None,  # type: ignore[arg-type]
    )


def test_equal_code_traces_to_equal_digests_and_a_baked_constant_changes_it() -> None:
    global SCALE
    torch.manual_seed(0)
    block = Block()
    first, again = trace_group(_call(block), None), trace_group(_call(block), None)
    assert first.failure is None and first.digest == again.digest
    SCALE = 3
    try:
        other = trace_group(_call(block), None)
    finally:
        SCALE = 2
    assert other.digest != first.digest
    said = first_difference(other, first.packed(), 0)
    assert said.startswith("line ") and "* 3" in said and "* 2" in said, said
    assert said.endswith("on rank 0"), said


def test_the_trace_is_not_counted_as_a_compile() -> None:
    window = Window.open()
    graphs = int(dynamo.counters()["stats"]["unique_graphs"])
    assert trace_group(_call(Block()), None).failure is None
    assert int(dynamo.counters()["stats"]["unique_graphs"]) == graphs + 1  # Dynamo traced it
    region = SimpleNamespace(records=[], graphs=0, graph_breaks={})
    window.close_into(region, "no_wrapper")
    assert (region.graphs, region.records) == (0, [])


def test_a_graph_that_cannot_be_traced_whole_says_why() -> None:
    class Breaks(Block):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            torch._dynamo.graph_break()
            return self.linear(x)

    traced = trace_group(_call(Breaks()), None)
    assert traced.digest == "" and traced.failure is not None
    assert "graph_break" in traced.failure or "graph break" in traced.failure, traced.failure
    said = first_difference(traced, trace_group(_call(Block()), None).packed(), 0)
    assert said.startswith("this rank could not trace it whole: "), said
