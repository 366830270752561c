"""Structural identity, exclusion and grouping: the helpers selectors build plans from."""

from __future__ import annotations

import torch
from torch import nn

from torchkiln.plugin import (
    StructureIndex,
    difference_kind,
    drop_excluded,
    group_by_structure,
    is_excluded,
    same_structure,
    structural_difference,
    structure_key,
)


class DropPath(nn.Module):
    def __init__(self, drop_prob: float) -> None:
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.drop_prob == 0.0 or not self.training else x * 0.5


class Block(nn.Module):
    def __init__(
        self, width: int = 8, drop_prob: float = 0.0, layer_idx: int = 0, shift: int = 0
    ) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.drop_path = DropPath(drop_prob)
        self.layer_idx = layer_idx
        self.shift = shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop_path(torch.roll(self.linear(x), self.shift, -1))


class OtherBlock(Block):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return -super().forward(x)


def test_identical_blocks_share_a_key_whatever_their_layer_index() -> None:
    """``layer_idx`` numbers the block; torchkiln traces it as a symbolic int."""
    a, b = Block(layer_idx=0), Block(layer_idx=7)
    assert structure_key(a) == structure_key(b)
    index = StructureIndex()
    assert index.key(a) == index.key(b)
    assert same_structure(a, b) and structural_difference(a, b) is None


def test_what_tells_blocks_apart() -> None:
    base = Block()
    assert structural_difference(base, Block(width=16)) == (
        "linear: parameter bias: (8,) float32 cpu vs (16,) float32 cpu"
    )
    assert difference_kind(base, Block(width=16)) == "parameter shapes"
    assert difference_kind(base, Block(drop_prob=0.1)) == "float attribute drop_path.drop_prob"
    assert structural_difference(base, Block(drop_prob=0.1)) == (
        "drop_path: float attribute drop_prob: 0.0 vs 0.1"
    )
    assert difference_kind(base, Block(shift=3)) == "int attribute shift"
    assert difference_kind(base, OtherBlock()) == "class"
    assert structural_difference(base, OtherBlock()) == "<self>: class: Block vs OtherBlock"
    frozen = Block()
    frozen.linear.weight.requires_grad_(False)
    assert "frozen" in (structural_difference(base, frozen) or "")
    half = Block().to(torch.float16)
    assert difference_kind(base, half) == "parameter shapes"  # shapes, dtypes, devices
    assert "float16" in (structural_difference(base, half) or "")


def test_index_keys_are_comparable_only_within_one_index() -> None:
    index = StructureIndex()
    keys = [index.key(Block(drop_prob=p)) for p in (0.0, 0.0, 0.1)]
    assert keys[0] == keys[1] != keys[2]


def test_exclusion_covers_the_subtree() -> None:
    assert is_excluded("model.layers.1", ["model.layers.1"])
    assert is_excluded("model.layers.1.mlp.up", ["model.layers.1"])  # under an excluded one
    assert not is_excluded("model.layers.10", ["model.layers.1"])
    assert is_excluded("model.layers.3", ["model.layers.[23]"])
    assert not is_excluded("model.layers.1", [])
    found = [(f"layers.{i}.mlp", nn.Linear(2, 2)) for i in range(3)]
    assert [p for p, _ in drop_excluded(found, ["layers.1"])] == ["layers.0.mlp", "layers.2.mlp"]


def test_group_by_structure_names_later_shapes_of_a_class() -> None:
    found = [
        ("a", Block()),
        ("b", Block(width=16)),
        ("c", Block()),
        ("d", OtherBlock()),
        ("e", Block(width=16)),
    ]
    groups = group_by_structure(found, lambda members: f"{len(members)} alike")
    assert [(g.name, [r.path for r in g.regions], g.reason) for g in groups] == [
        ("Block", ["a", "c"], "2 alike"),
        ("Block_2", ["b", "e"], "2 alike"),
        ("OtherBlock", ["d"], "1 alike"),
    ]
    assert all(r.group == g.name for g in groups for r in g.regions)


def test_only_block_numbers_are_left_out() -> None:
    from torchkiln.engine.structure import INDEX_ATTRIBUTE

    numbers = ["layer_idx", "layer_id", "layer_number", "block_index", "stage_idx", "idx"]
    assert all(INDEX_ATTRIBUTE.match(name) for name in numbers)
    others = ["padding_idx", "pad_token_id", "num_heads", "shift_size", "eos_idx", "conv_idx"]
    assert not any(INDEX_ATTRIBUTE.match(name) for name in others)
    a, b = nn.Embedding(10, 4, padding_idx=0), nn.Embedding(10, 4, padding_idx=1)
    assert difference_kind(a, b) == "int attribute padding_idx"


def test_an_int_and_a_float_attribute_of_one_name_are_one_difference() -> None:
    """UNet: ``output_scale_factor`` is a float 1.0 in some resnets and an int 1 in others;
    this used to say ``float attribute output_scale_factor: 1.0 vs absent``."""
    a, b = Block(), Block()
    a.output_scale_factor = 1.0
    b.output_scale_factor = 1
    assert (
        structural_difference(a, b) == "<self>: attribute output_scale_factor: float 1.0 vs int 1"
    )
    assert difference_kind(a, b) == "attribute output_scale_factor"


def test_submodules_one_side_lacks_are_named() -> None:
    a, b = Block(), Block()
    a.context_norm = nn.LayerNorm(8)
    assert structural_difference(a, b) == "<self>: children: context_norm vs absent"
    assert difference_kind(a, b) == "submodules (context_norm)"
