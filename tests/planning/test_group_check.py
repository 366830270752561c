"""The group invariant: a plan whose group mixes ``forward`` code is refused before anything
is touched, with a ``PluginError`` naming the selector's plugin."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import torchkiln
from torchkiln import PluginError, hookimpl
from torchkiln.plugin import (
    Region,
    RegionGroup,
    RegionPlan,
    SelectorSpec,
    check_group,
    check_plan,
    forward_code_problems,
)


class Doubling(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * self.linear(x)


class Negating(nn.Module):
    """The same attributes and parameter shapes as Doubling, other forward code."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return -self.linear(x)


class Inherits(Doubling):
    """Another class, Doubling's forward function: running it for both is right."""


class Mixed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Doubling(), Negating(), Inherits()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class AllBlocksOneGroup:
    """A careless selector: every block in one group, whatever its class."""

    def __init__(self, paths: tuple[str, ...] = ("blocks.0", "blocks.1", "blocks.2")) -> None:
        self.paths = paths

    @hookimpl
    def declare_selectors(self) -> list[SelectorSpec]:
        return [SelectorSpec("one-group", "every block in one group")]

    @hookimpl
    def select_regions(
        self, model: nn.Module, config: torchkiln.CompileConfig, selector: str
    ) -> RegionPlan | None:
        if selector != "one-group":
            return None
        regions = tuple(Region(p, model.get_submodule(p), "blocks") for p in self.paths)
        return RegionPlan("one-group", (RegionGroup("blocks", regions, "all of them"),))


def test_a_mixed_forward_group_is_refused_before_anything_is_touched(
    pm: torchkiln.PluginManager,
) -> None:
    pm.register(AllBlocksOneGroup(), name="careless-selector")
    model = Mixed()
    before = {name: dict(module.__dict__) for name, module in model.named_modules()}
    with pytest.raises(PluginError) as raised:
        torchkiln.compile(model, backend="eager", regions="one-group", plugins=pm)
    message = str(raised.value)
    assert "selector plugin 'careless-selector'" in message
    assert "different forward code in group 'blocks'" in message
    assert "'blocks.0'" in message and "'blocks.1'" in message and "Negating" in message
    assert not torchkiln.is_compiled(model)
    assert {name: dict(module.__dict__) for name, module in model.named_modules()} == before
    with pytest.raises(PluginError, match="careless-selector"):
        torchkiln.plan(model, backend="eager", regions="one-group", plugins=pm)


def test_classes_sharing_one_forward_function_may_share_a_group(
    pm: torchkiln.PluginManager,
) -> None:
    pm.register(AllBlocksOneGroup(("blocks.0", "blocks.2")), name="careless-selector")
    model = Mixed().eval()
    x = torch.randn(2, 4)
    expected = model(x)
    torchkiln.compile(model, backend="eager", regions="one-group", plugins=pm, progress="off")
    torch.testing.assert_close(model(x), expected)


def test_builtin_strategies_never_mix_forward_code() -> None:
    found = torchkiln.plan(
        Mixed(), backend="eager", regions={"strategy": "classes", "classes": ["*"]}
    )
    assert [g.name for g in found.groups] == ["Mixed"]  # outermost match: the root
    found = torchkiln.plan(
        Mixed(), backend="eager", regions={"strategy": "paths", "paths": ["blocks.*"]}
    )
    assert [(g.name, len(g.regions)) for g in found.groups] == [
        ("Doubling", 1),
        ("Negating", 1),
        ("Inherits", 1),
    ]


def test_check_plan_refuses_broken_plans() -> None:
    model = Mixed()
    first, second = model.blocks[0], model.blocks[2]

    def plan(*groups: RegionGroup) -> RegionPlan:
        return RegionPlan("mine", groups)

    with pytest.raises(
        PluginError, match=re.escape("'blocks.1' of group 'g' is not the module at that")
    ):
        check_plan(plan(RegionGroup("g", (Region("blocks.1", first, "g"),))), model, plugin="p")
    with pytest.raises(PluginError, match=re.escape("module 'blocks.0' is in two regions")):
        check_plan(
            plan(
                RegionGroup("g", (Region("blocks.0", first, "g"),)),
                RegionGroup("h", (Region("blocks.0", first, "h"),)),
            ),
            model,
        )
    with pytest.raises(PluginError, match="two groups named 'g'"):
        check_plan(
            plan(
                RegionGroup("g", (Region("blocks.0", first, "g"),)),
                RegionGroup("g", (Region("blocks.2", second, "g"),)),
            ),
            model,
        )
    with pytest.raises(PluginError, match="in group 'g' but says group 'other'"):
        check_group(RegionGroup("g", (Region("blocks.0", first, "other"),)), plugin="p")
    with pytest.raises(PluginError, match="no regions"):
        check_group(RegionGroup("g", ()))
    check_plan(
        plan(RegionGroup("g", (Region("blocks.0", first, "g"), Region("blocks.2", second, "g")))),
        model,
    )


def test_forward_code_problems_lists_each_odd_member() -> None:
    model = Mixed()
    regions = tuple(Region(f"blocks.{i}", model.blocks[i], "g") for i in range(3))
    assert forward_code_problems(RegionGroup("g", regions)) == [
        "modules with different forward code in group 'g': 'blocks.0' "
        f"({__name__}.Doubling) and 'blocks.1' ({__name__}.Negating)"
    ]
    assert forward_code_problems(RegionGroup("g", (regions[0], regions[2]))) == []


class Scaled(nn.Module):
    """A parameter dict read by the forward that holds it: the dict itself is never called."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.scales = nn.ParameterDict({"a": nn.Parameter(torch.ones(4))})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * self.scales["a"]


def test_a_region_that_is_never_called_is_refused() -> None:
    """A region with no forward (``nn.ParameterDict``) would stay ``pending`` for ever."""
    model = Scaled()
    group = RegionGroup("g", (Region("scales", model.scales, "g"),))
    problem = (
        "'scales' (torch.nn.modules.container.ParameterDict) has no forward of its own: nothing "
        "calls it, so as a region it would never compile nor run"
    )
    with pytest.raises(PluginError, match=re.escape(problem)):
        check_plan(RegionPlan("mine", (group,)), model, plugin="p")
    with pytest.raises(PluginError, match=re.escape(f"never called: {problem}")):
        check_group(group, plugin="p")


def test_the_classes_selector_leaves_a_parameter_dict_eager_with_why() -> None:
    found = torchkiln.plan(
        Scaled(), backend="eager", regions={"strategy": "classes", "classes": ["ParameterDict"]}
    )
    assert found.groups == ()
    assert ("scales", "no forward of its own: never called, its parameters are read by the "
            "forward of <root>") in [(e.path, e.reason) for e in found.eager]  # fmt: skip
