"""The torch.nn built-in trap: nn.Module.compile() on nn.Linear, nn.Sequential or
nn.TransformerEncoderLayer compiles nothing in torch 2.11 to 2.13 (2.14 compiles them).
torchkiln compiles them for real on every release."""

import torch
import torch._dynamo
from torch import nn
from torch._dynamo.utils import counters

import torchkiln


def layer() -> nn.Module:
    torch.manual_seed(0)
    return nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)


x = torch.randn(2, 5, 16)

torch._dynamo.reset()
counters.clear()
module_compiled = layer()
module_compiled.compile(backend="eager")
module_compiled(x)
print("nn.Module.compile():", counters["stats"]["unique_graphs"], "graphs")
trapped = tuple(int(part) for part in torch.__version__.split(".")[:2]) < (2, 14)
assert (counters["stats"]["unique_graphs"] == 0) is trapped  # up to 2.13: silently nothing

torch._dynamo.reset()
counters.clear()
kiln_compiled = torchkiln.compile(layer(), backend="eager", regions="whole")
kiln_compiled(x)
print("torchkiln.compile():", counters["stats"]["unique_graphs"], "graph(s)")
assert counters["stats"]["unique_graphs"] == 1
assert type(kiln_compiled) is nn.TransformerEncoderLayer  # same class, same state-dict keys
assert list(kiln_compiled.state_dict()) == list(layer().state_dict())
