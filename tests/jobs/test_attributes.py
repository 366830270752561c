"""The plain attributes a group's key holds (what Dynamo bakes into code as constants)."""

from __future__ import annotations

import torch
from torch import nn

from torchkiln.examples import llama
from torchkiln.jobs.attributes import differing_attributes, plain_attributes

SHAPE = {"depth": 1, "hidden_size": 32, "heads": 4, "kv_heads": 2, "intermediate_size": 64,
         "vocab_size": 128}  # fmt: skip


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = 0.5
        self.name = "block"
        self.shape = (2, [3, torch.float16])
        self.inner = nn.Linear(2, 2)
        self._private = 7  # torch's registries and engines' state are private: not read
        self.handle = object()  # not plain data: left out


def test_public_plain_values_of_the_block_and_its_submodules_by_path() -> None:
    assert plain_attributes(Scaled()) == {
        "scale": 0.5,
        "name": "block",
        "shape": [2, [3, "torch.float16"]],
        "inner.in_features": 2,
        "inner.out_features": 2,
    }


def test_a_transformers_config_counts_by_its_fields_once() -> None:
    layer = llama(**SHAPE).model.layers[0]
    found = plain_attributes(layer)
    configs = [name for name in found if name.endswith(".config") or name == "config"]
    assert configs == ["self_attn.config"]  # the layer's modules share one config object
    assert found["self_attn.config"]["hidden_size"] == 32
    assert found["self_attn.scaling"] == layer.self_attn.scaling


def test_the_difference_names_each_attribute_and_its_two_values() -> None:
    mine, rank0 = plain_attributes(Scaled()), plain_attributes(Scaled())
    mine["scale"], mine["inner.in_features"] = 0.25, 4
    assert differing_attributes(mine, rank0, limit=1) == (
        "scale: 0.25 here, 0.5 on rank 0 and 1 more"
    )
