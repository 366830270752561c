"""Plans worth compiling: a model's declared ``_repeated_blocks``, small pieces of units that
differ, and a plan that stays poor saying so."""

from __future__ import annotations

import torch
from torch import nn

import torchkiln
from torchkiln.plugins.plan_notes import poor_plan_note


class Attention(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.proj(x))


class Stage(nn.Module):
    """Two attention blocks of the stage's width (a UNet's down, mid and up blocks)."""

    def __init__(self, width: int, blocks: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Attention(width) for _ in range(blocks))
        self.conv = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.conv(x)


class Declared(nn.Module):
    _repeated_blocks = ("Attention",)

    def __init__(self) -> None:
        super().__init__()
        self.down = Stage(8, 2)
        self.mid = Stage(16, 1)
        self.up_in = nn.Linear(8, 16)
        self.up_out = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up_out(self.mid(self.up_in(self.down(x))))


def test_declared_repeated_blocks_are_the_level_every_instance_included() -> None:
    model = Declared()
    plan = torchkiln.plan(model)
    paths = [r.path for g in plan.groups for r in g.regions]
    assert paths == ["down.blocks.0", "down.blocks.1", "mid.blocks.0"]  # the singleton too
    assert len(plan.groups) == 2
    assert "as the model's _repeated_blocks names" in plan.reason
    x = torch.randn(2, 8)
    expected = model(x)
    torchkiln.compile(model, backend="eager", progress="off")
    torch.testing.assert_close(model(x), expected)
    assert all(r.status == "compiled" for r in torchkiln.report(model).regions)


def test_declared_blocks_that_do_not_check_out_are_only_hints() -> None:
    model = Declared()
    model._repeated_blocks = ("NoSuchBlock",)
    plan = torchkiln.plan(model)
    assert "_repeated_blocks" not in plan.reason


class Piece(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x).relu()


class Unit(nn.Module):
    """A large unit with small pieces; ``skip`` differs between units (EfficientNet's
    InvertedResidual and its ``has_skip``)."""

    def __init__(self, width: int, skip: bool) -> None:
        super().__init__()
        self.big = nn.Linear(width, width)
        self.piece = Piece(width)
        self.skip = skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.piece(self.big(x))
        return x + y if self.skip else y


class Pieces(nn.Module):
    """Units of many widths, each of two kinds: only the small pieces repeat by shape."""

    def __init__(
        self, widths: tuple[int, ...] = (8, 12, 16, 20, 24, 28), twins: bool = False
    ) -> None:
        super().__init__()
        # twins: two identical units first, so that Unit is a chosen block class.
        layers: list[nn.Module] = [Unit(4, True), Unit(4, True), nn.Linear(4, 8)] if twins else []
        for width in widths:
            layers += [Unit(width, False), Unit(width, True), nn.Linear(width, widths[-1])]
        self.layers = nn.ModuleList(layers)


def test_a_poor_plan_drops_small_pieces_of_units_that_differ() -> None:
    model = Pieces(twins=True)
    plan = torchkiln.plan(model)
    # Before: the twin Units and one group of two Pieces per width (7 groups); now the Units.
    assert [r.path for g in plan.groups for r in g.regions] == ["layers.0", "layers.1"]
    reasons = {p.path: p.reason for p in plan.eager}
    assert "a shape of its own" in reasons["layers.3"]
    assert "poor plan" not in plan.reason


def test_a_plan_still_poor_says_so() -> None:
    plan = torchkiln.plan(Pieces())
    assert len(plan.groups) == 6
    assert plan.reason.endswith(
        "a poor plan: 6 groups for 12 regions, about 6 graphs where a whole-model compile "
        "needs 1: consider regions=classes:Unit or regions=whole"
    )


def test_poor_plan_note_names_a_coarser_class() -> None:
    model = Pieces()
    from torchkiln.plugin import Region, RegionGroup

    groups = []
    for index in range(6):
        pieces = [
            (f"layers.{3 * index + k}.piece", model.layers[3 * index + k].piece) for k in (0, 1)
        ]
        name = f"Piece_{index}"
        groups.append(RegionGroup(name, tuple(Region(p, m, name) for p, m in pieces), "pieces"))
    note = poor_plan_note(model, groups, 2)
    assert note.startswith("a poor plan: 6 groups for 12 regions, about 6 graphs")
    assert note.endswith("consider regions=classes:Unit or regions=whole")
