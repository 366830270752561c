"""The region error policy, shown with a backend plugin that fails for one block class."""

from typing import Any

import torch
from torch import nn

import torchkiln
from torchkiln.plugin import BackendSpec


def refuse(graph_module: torch.fx.GraphModule, example_inputs: Any) -> Any:
    raise RuntimeError("this backend cannot compile attention")


class PickyBackend:
    """Backend ``picky``: compiles MLP blocks with Dynamo's eager backend, refuses the others."""

    @torchkiln.hookimpl
    def declare_backends(self) -> list[BackendSpec]:
        return [BackendSpec("picky", "fails on purpose for every group but Mlp")]

    @torchkiln.hookimpl
    def compile_region(self, fn: Any, group: Any, backend: str) -> Any:
        return torch.compile(fn, backend="eager" if group.name == "Mlp" else refuse)


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.linear(x))


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attn(x, x, x, need_weights=False)[0]


def model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(Attention(), Mlp(), Attention(), Mlp()).eval()


plugins = torchkiln.PluginManager()  # an isolated manager: built-ins plus what we register
plugins.register(PickyBackend(), name="picky-backend")
x = torch.randn(2, 5, 16)

# raise (the default): the first call fails, naming the region and its group.
strict = torchkiln.compile(model(), backend="picky", plugins=plugins)
try:
    strict(x)
except torchkiln.RegionCompileError as error:
    print(f"raise: region {error.path!r}, group {error.group!r}")
    assert (error.path, error.group) == ("0", "Attention")

# eager: the failing regions run eagerly, the others stay compiled, the report says why.
lenient = torchkiln.compile(model(), backend="picky", plugins=plugins, on_region_error="eager")
torch.testing.assert_close(lenient(x), model()(x))
report = torchkiln.report(lenient)
print(report)
status = {r.path: r.status for r in report.regions}  # grouped: Attention's regions first
assert status == {"0": "eager", "2": "eager", "1": "compiled", "3": "compiled"}
assert all("cannot compile attention" in r.fallback_reason for r in report.regions[:2])
