"""The report states what Dynamo recorded: pending regions, graph breaks, later recompiles, and
nothing that belongs to another model."""

from __future__ import annotations

import torch
import torch._dynamo
from engine_zoo import WIDTH, MlpBlock, NestedListModel, graphs_compiled, token_ids
from torch import nn

import torchkiln


class BreakingBlock(MlpBlock):
    """A block with a graph break in the middle of its forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.up(self.norm(x)).chunk(2, dim=-1)[0]
        torch._dynamo.graph_break()
        return x + self.down(torch.cat([x, x], dim=-1))


class TwiceBreakingBlock(MlpBlock):
    """Two graph breaks of the same kind, at two places."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.up(self.norm(x)).chunk(2, dim=-1)[0]
        torch._dynamo.graph_break()
        x = x * 2
        torch._dynamo.graph_break()
        return x + self.down(torch.cat([x, x], dim=-1))


class BreakingStack(nn.Module):
    def __init__(self, block: type[MlpBlock] = BreakingBlock) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(block() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def compile_eager(model: nn.Module) -> nn.Module:
    return torchkiln.compile(model, backend="eager", progress="off")


def test_before_the_first_call_every_region_is_pending() -> None:
    model = compile_eager(NestedListModel())
    report = torchkiln.report(model)
    assert [r.status for r in report.regions] == ["pending"] * 4
    assert report.total_graphs == 0 and not any(r.reused for r in report.regions)


def test_graph_breaks_are_counted_per_region() -> None:
    model = compile_eager(BreakingStack().eval())
    with torch.no_grad():
        model(torch.randn(2, 4, WIDTH))
    first, *others = torchkiln.report(model).regions
    # Dynamo's counter sees the break twice: where torchkiln's group function calls the block,
    # and inside the block's own frame. The report counts it once, as plain torch.compile does.
    [reason] = first.graph_breaks
    assert "graph_break()" in reason
    assert first.graph_breaks == {reason: 1}
    assert first.graphs == 2  # before and after the break
    assert all(r.reused and r.graph_break_count == 0 for r in others)


def test_each_break_in_a_block_is_counted_once() -> None:
    model = compile_eager(BreakingStack(TwiceBreakingBlock).eval())
    with torch.no_grad():
        model(torch.randn(2, 4, WIDTH))
    first, *others = torchkiln.report(model).regions
    assert first.graph_break_count == 2
    assert first.graphs == 3
    assert all(r.graph_break_count == 0 for r in others)


def test_later_recompiles_are_listed_by_group() -> None:
    model = compile_eager(NestedListModel().eval())
    with torch.no_grad():
        model(token_ids(batch=2))
        assert torchkiln.report(model).later_recompiles == {}
        model(token_ids(batch=3))
    report = torchkiln.report(model)
    [reasons] = report.later_recompiles.values()
    assert list(report.later_recompiles) == ["MlpBlock"]
    assert len(reasons) == 1 and "size mismatch" in reasons[0]
    assert [r.status for r in report.regions] == ["compiled"] * 4  # the first calls' records


def test_another_models_compiles_are_not_this_models() -> None:
    """Two models with a group of the same name (``MlpBlock``): each report is its own."""
    first = compile_eager(NestedListModel().eval())
    second = compile_eager(NestedListModel().eval())
    with torch.no_grad():
        first(token_ids())
        first(token_ids(batch=3))  # a later recompile of the first model
        second(token_ids())
    assert graphs_compiled() == 3
    assert list(torchkiln.report(first).later_recompiles) == ["MlpBlock"]
    second_report = torchkiln.report(second)
    assert second_report.later_recompiles == {}
    assert second_report.total_graphs == 1
