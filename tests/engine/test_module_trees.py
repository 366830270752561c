"""Property: on random module trees (nested ``ModuleList`` / ``Sequential`` / ``ModuleDict`` of
small blocks), compiled outputs equal eager ones and decompile restores the model exactly."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch._dynamo
from fingerprint import Fingerprint
from torch import nn

import torchkiln

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

WIDTH = 8


class Affine(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x))


class Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(WIDTH) * 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.weight) + x


class Norm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


LEAVES = (Affine, Gate, Norm)


def run(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Containers without a forward of their own are walked in order."""
    if isinstance(module, nn.ModuleList):
        for child in module:
            x = run(child, x)
        return x
    if isinstance(module, nn.ModuleDict):
        for child in module.values():
            x = run(child, x)
        return x
    return module(x)


class Tree(nn.Module):
    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return run(self.body, x)


class Walk(nn.Module):
    """Makes a ``ModuleList`` / ``ModuleDict`` callable inside an ``nn.Sequential``."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return run(self.inner, x)


def _callable(module: nn.Module) -> nn.Module:
    return Walk(module) if isinstance(module, nn.ModuleList | nn.ModuleDict) else module


def _container(kind: str, children: list[nn.Module]) -> nn.Module:
    if kind == "list":
        return nn.ModuleList(children)
    if kind == "dict":
        return nn.ModuleDict({f"part_{i}": child for i, child in enumerate(children)})
    return nn.Sequential(*(_callable(child) for child in children))


leaf = st.sampled_from(LEAVES).map(lambda cls: ("leaf", cls))
shape = st.recursive(
    leaf,
    lambda inner: st.tuples(
        st.sampled_from(["list", "dict", "sequential"]), st.lists(inner, min_size=1, max_size=4)
    ),
    max_leaves=12,
)


def build(spec: Any) -> nn.Module:
    kind, content = spec
    if kind == "leaf":
        return content()
    return _container(kind, [build(child) for child in content])


@hypothesis.settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[hypothesis.HealthCheck.too_slow],
    derandomize=True,
)
@hypothesis.given(spec=shape, seed=st.integers(0, 2**16))
def test_random_module_trees_compile_like_eager_and_decompile_exactly(spec: Any, seed: int) -> None:
    torch._dynamo.reset()
    torch.manual_seed(seed)
    model = Tree(build(spec))
    x = torch.randn(2, 3, WIDTH)
    with torch.no_grad():
        expected = model(x)
    before = Fingerprint.of(model)
    pm = torchkiln.PluginManager(entry_points=False, env={})
    torchkiln.compile(model, plugins=pm, backend="eager", progress="off")
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
        torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
    report = torchkiln.report(model)
    assert all(r.status == "compiled" for r in report.regions), str(report)
    torchkiln.decompile(model)
    assert Fingerprint.of(model).differences(before) == []
