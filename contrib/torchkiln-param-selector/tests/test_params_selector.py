"""torchkiln-param-selector, installed: the ``params`` region strategy, found through its entry
point, choosing regions by a user-declared attribute or by parameter count."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch
import torch.nn.functional as F
import torchkiln_param_selector
from torch import nn

import torchkiln


class Block(nn.Module):
    """A gated MLP block: three Linear layers, each well under 10% of the model."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up, self.gate = nn.Linear(width, 2 * width), nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Model(nn.Module):
    def __init__(self, depth: int = 4, width: int = 32) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(64, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, width)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


IDS = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))


def plan_paths(model: nn.Module, **options) -> list[str]:
    return [
        r.path for r in torchkiln.plan(model, regions={"strategy": "params", **options}).regions()
    ]


def test_selector_is_installed_and_found_through_its_entry_point():
    site_packages = Path(sysconfig.get_paths()["purelib"])
    assert Path(torchkiln_param_selector.__file__).is_relative_to(site_packages)
    declared = torchkiln.PluginManager().selectors()["params"]
    assert declared.plugin == "params"


def test_default_threshold_picks_the_blocks_and_compiles_them_as_one_group():
    model = Model()
    total = sum(p.numel() for p in model.parameters())
    block = sum(p.numel() for p in model.blocks[0].parameters())
    assert block >= total // 10 > max(p.numel() for p in model.blocks[0].up.parameters())
    assert plan_paths(model) == [f"blocks.{i}" for i in range(4)]

    expected = model(IDS)
    torchkiln.compile(model, backend="aot_eager", regions="params")
    torch.testing.assert_close(model(IDS), expected)
    report = torchkiln.report(model)
    assert report.selector == "params"
    assert {r.group for r in report.regions} == {"Block"}
    assert report.total_graphs >= 1


def test_user_declared_attribute_wins_over_parameter_count():
    model = Model()
    model.head.torchkiln_region = True  # on an instance
    model.blocks[2].torchkiln_region = True
    model.blocks[2].up.torchkiln_region = True  # inside a marked module: not separate
    assert plan_paths(model) == ["blocks.2", "head"]
    plan = torchkiln.plan(model, regions="params")
    assert "sets torchkiln_region = True" in plan.reason
    assert {g.name for g in plan.groups} == {"Block", "Linear"}


def test_exclude_is_honoured():
    model = Model()
    plan = torchkiln.plan(model, regions={"strategy": "params", "exclude": ["blocks.[02]"]})
    assert [r.path for r in plan.regions()] == ["blocks.1", "blocks.3"]
    assert [(e.path, e.reason) for e in plan.eager if e.path.startswith("blocks.")][:2] == [
        ("blocks.0", "excluded (regions.exclude)"),
        ("blocks.2", "excluded (regions.exclude)"),
    ]


def test_min_params_option_moves_the_cut():
    model = Model()
    assert plan_paths(model, options={"min_params": 2000}) == [
        "embed",
        *(f"blocks.{i}.{name}" for i in range(4) for name in ("up", "gate", "down")),
    ]
