"""Properties of the ``repeated`` plan on random module trees (hypothesis).

Trees are built from a few block classes with random widths, float attributes and layer
indexes, nested in lists, sequentials, dicts and plain attributes. Whatever the tree:

- regions never nest, and no module is in two regions;
- every group holds ``min_repeats`` or more structurally identical modules, and two groups never
  share a shape;
- every region is a block (parameters and children), and excluded paths hold no region;
- no region could be replaced by its parent: a parent whose shape repeats elsewhere too would
  have been chosen (the largest level wins), unless it is a stack or holds several regions;
- the plan is deterministic, and compiling it keeps the outputs.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchkiln
from torchkiln.plugin import StructureIndex, is_excluded

pytest.importorskip("hypothesis", reason="the plan properties are hypothesis tests")
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


class Mlp(nn.Module):
    def __init__(self, width: int, scale: float, layer_idx: int) -> None:
        super().__init__()
        self.up = nn.Linear(4, width)
        self.down = nn.Linear(width, 4)
        self.scale = scale
        self.layer_idx = layer_idx

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.scale * self.down(torch.relu(self.up(x)))


class Gate(Mlp):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.down(self.up(x)))


class Stage(nn.Module):
    def __init__(self, blocks: list[nn.Module], norm: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.norm = nn.LayerNorm(4) if norm else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


class Root(nn.Module):
    def __init__(self, parts: list[nn.Module]) -> None:
        super().__init__()
        self.stem = nn.Linear(4, 4)
        self.parts = nn.ModuleList(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for part in self.parts:
            x = part(x)
        return x


@st.composite
def blocks(draw: st.DrawFn) -> nn.Module:
    cls = draw(st.sampled_from([Mlp, Mlp, Gate]))
    width = draw(st.sampled_from([4, 8]))
    scale = draw(st.sampled_from([1.0, 1.0, 0.5]))
    return cls(width, scale, draw(st.integers(0, 20)))


@st.composite
def parts(draw: st.DrawFn) -> nn.Module:
    kind = draw(st.sampled_from(["block", "stage", "sequential"]))
    if kind == "block":
        return draw(blocks())
    inner = draw(st.lists(blocks(), min_size=1, max_size=4))
    if kind == "stage":
        return Stage(inner, draw(st.booleans()))
    return nn.Sequential(*inner)


@st.composite
def models(draw: st.DrawFn) -> nn.Module:
    return Root(draw(st.lists(parts(), min_size=1, max_size=5))).eval()


def check(plan: torchkiln.plugin.RegionPlan, exclude: list[str]) -> None:
    index = StructureIndex()
    paths = [r.path for r in plan.regions()]
    for path in paths:
        assert not any(p != path and path.startswith(p + ".") for p in paths), "nested regions"
        assert not is_excluded(path, exclude)
    assert len({id(r.module) for r in plan.regions()}) == len(paths)
    keys = []
    for group in plan.groups:
        shapes = {index.key(r.module) for r in group.regions}
        assert len(shapes) == 1
        keys.append(shapes.pop())
        for region in group.regions:
            module = region.module
            assert next(module.children(), None) is not None
            assert next(module.parameters(), None) is not None
    assert len(keys) == len(set(keys))
    if not exclude:
        assert all(len(g.regions) >= 2 for g in plan.groups)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=models(), exclude=st.sampled_from([[], ["parts.0"], ["parts.1.*"]]))
def test_plans_keep_their_invariants(model: nn.Module, exclude: list[str]) -> None:
    options = {"strategy": "repeated", "exclude": exclude}
    plan = torchkiln.plan(model, backend="eager", regions=options)
    check(plan, exclude)
    again = torchkiln.plan(model, backend="eager", regions=options)
    assert [(g.name, [r.path for r in g.regions]) for g in again.groups] == [
        (g.name, [r.path for r in g.regions]) for g in plan.groups
    ]


@settings(max_examples=40, deadline=None)
@given(model=models())
def test_no_region_could_be_its_parent(model: nn.Module) -> None:
    """The largest level wins: a region's parent is not itself a repeated block that holds only
    this region (it would have been chosen instead), unless it is a container."""
    plan = torchkiln.plan(model, backend="eager", regions="repeated")
    index = StructureIndex()
    counts: dict[int, int] = {}
    for _, module in model.named_modules():
        counts[index.key(module)] = counts.get(index.key(module), 0) + 1
    for region in plan.regions():
        parent_path = region.path.rpartition(".")[0]
        if not parent_path:
            continue
        parent = model.get_submodule(parent_path)
        if isinstance(parent, nn.ModuleList | nn.ModuleDict | nn.Sequential):
            continue
        assert (
            counts[index.key(parent)] < 2
            or sum(1 for r in plan.regions() if r.path.startswith(parent_path + ".")) > 1
        ), f"{parent_path} repeats and holds only {region.path}"


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=models())
def test_compiled_plans_keep_the_outputs(model: nn.Module) -> None:
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(x)
        torchkiln.compile(model, backend="eager", regions="repeated", progress="off")
        torch.testing.assert_close(model(x), expected)
    torchkiln.decompile(model)
