"""With dispatch="direct" (opt-in), steady-state calls of a region skip torch.compile's per-call
wrapper, yet every input Dynamo's guards reject still recompiles, as without torchkiln."""

import copy

import torch
from torch import nn

import torchkiln


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)
        self.scale = 1.0  # a plain float the graph reads: Dynamo guards on its value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.scale * self.linear(x).tanh()


torch.manual_seed(0)
eager = nn.Sequential(*(Block() for _ in range(4)))
model = torchkiln.compile(copy.deepcopy(eager), backend="eager", progress="off", dispatch="direct")
x = torch.randn(2, 16)
with torch.no_grad():
    for _ in range(3):  # the first call compiles; the later block calls are dispatched directly
        torch.testing.assert_close(model(x), eager(x))

    # Each of these fails a guard: torchkiln hands the call to Dynamo, which recompiles.
    eager[2].scale = model[2].scale = 0.5
    torch.testing.assert_close(model(x), eager(x))
    wide = torch.randn(7, 16)
    torch.testing.assert_close(model(wide), eager(wide))
report = torchkiln.report(model)
print(report)  # later calls: region 2 recompiled for module.scale, region 0 for the shape
assert sum(region.later_graphs for region in report.regions) == 2  # one per change above

# dispatch="dynamo", the default: every call goes through torch.compile's wrapper.
plain = torchkiln.compile(copy.deepcopy(eager), backend="eager")
with torch.no_grad():
    torch.testing.assert_close(plain(x), eager(x))
