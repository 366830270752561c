"""Blocks that differ only in an integer attribute share one compiled function: torchkiln traces
module int attributes (``layer_idx``) as symbolic, so 12 blocks need 2 graphs, not 12."""

import torch
import torch._dynamo
from torch import nn
from torch._dynamo.utils import counters

import torchkiln


class Block(nn.Module):
    def __init__(self, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx  # Dynamo would guard on its value: one recompile per block
        self.linear = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.linear(x)) / (self.layer_idx + 1)


def stack() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*(Block(i) for i in range(12)))


x = torch.randn(2, 16)
with torch.no_grad():
    model = torchkiln.compile(stack(), backend="eager")
    model(x)
    print("default:", counters["stats"]["unique_graphs"], "graphs for 12 blocks")
    assert counters["stats"]["unique_graphs"] == 2  # layer_idx == 0, then layer_idx symbolic

    # dynamic=False forbids symbolic values: every block specialises, block 8 hits Dynamo's
    # recompile limit (8) and from there the blocks run eagerly. The report says so.
    torch._dynamo.reset()
    counters.clear()
    model = torchkiln.compile(stack(), backend="eager", dynamic=False)
    model(x)
    report = torchkiln.report(model)
    print(report)
    assert [r.path for r in report.regions if r.recompile_limit_hit] == ["8"]
    assert [r.status for r in report.regions[8:]] == ["eager"] * 4
