"""Region selection: repeated blocks in every container, groups by exact class, model hints,
``rest``, ``exclude``, ``whole``, ``classes``, ``paths`` and ``auto``'s fallback, which is never
silent."""

from __future__ import annotations

import copy
import json
import logging

import pytest
import torch
from engine_zoo import (
    WIDTH,
    DictModel,
    MlpBlock,
    NestedListModel,
    graphs_compiled,
    llama,
    sequential_model,
    token_ids,
)
from torch import nn

import torchkiln
from torchkiln.plugin import RegionPlan


def plan(model: nn.Module, **regions: object) -> RegionPlan:
    return torchkiln.plan(model, backend="eager", regions=regions or "auto")


def paths(found: RegionPlan) -> dict[str, list[str]]:
    return {group.name: [region.path for region in group.regions] for group in found.groups}


# --- models for this file ------------------------------------------------------------------------


class EncoderBlock(MlpBlock):
    pass


class DecoderBlock(MlpBlock):
    pass


class Stack(nn.Module):
    def __init__(self, block: type[nn.Module], depth: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList(block() for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class EncoderDecoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = Stack(EncoderBlock)
        self.decoder = Stack(DecoderBlock)
        self.head = nn.Linear(WIDTH, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.decoder(self.encoder(x)))


def same_named_block(module: str) -> type[nn.Module]:
    """A class called ``Block`` defined in ``module`` (two libraries, one class name)."""
    return type("Block", (MlpBlock,), {"__module__": module, "__qualname__": "Block"})


BlockA, BlockB = same_named_block("library_a.layers"), same_named_block("library_b.layers")


class TwoLibraries(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.ModuleList(BlockA() for _ in range(2))
        self.second = nn.ModuleList(BlockB() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in [*self.first, *self.second]:
            x = block(x)
        return x


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Inner()
        self.norm = nn.LayerNorm(WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.inner(x))


class Hinted(nn.Module):
    """Three ``Outer`` blocks; the class names ``Inner`` as its block (a transformers hint)."""

    _no_split_modules = ["Inner"]

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Outer() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def hidden() -> torch.Tensor:
    return torch.randn(2, 4, WIDTH, generator=torch.Generator().manual_seed(0))


# --- repeated blocks -----------------------------------------------------------------------------


def test_blocks_in_a_module_list() -> None:
    assert paths(plan(Stack(MlpBlock, depth=3))) == {
        "MlpBlock": ["layers.0", "layers.1", "layers.2"]
    }


def test_blocks_in_a_sequential_root() -> None:
    """The root itself a Sequential: its stem (index 0) and norm are single, so left eager."""
    found = plan(sequential_model())
    assert paths(found) == {"MlpBlock": ["1", "2", "3"]}
    assert [part.path for part in found.eager] == ["0", "4"]


def sequential_mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(), nn.Linear(2 * WIDTH, WIDTH))


class SequentialBlocks(nn.Module):
    """Blocks that are themselves ``nn.Sequential``s, in a ModuleList."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(sequential_mlp() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return x


def test_sequential_blocks_in_a_list_are_blocks() -> None:
    """Not their Linears: a Sequential item of a container is a block like any module."""
    model = SequentialBlocks().eval()
    twin = copy.deepcopy(model)
    assert paths(plan(model)) == {"Sequential": ["blocks.0", "blocks.1", "blocks.2"]}
    assert paths(plan(nn.Sequential(*(sequential_mlp() for _ in range(3))))) == {
        "Sequential": ["0", "1", "2"]
    }

    torchkiln.compile(model, backend="eager", progress="off")
    with torch.no_grad():
        torch.testing.assert_close(model(hidden()), twin(hidden()))
    assert graphs_compiled() == 1  # nn.Sequential is a torch.nn built-in: compiled all the same


def test_sequential_stages_of_blocks_are_looked_into() -> None:
    stages = nn.ModuleList(nn.Sequential(MlpBlock(), MlpBlock()) for _ in range(2))
    model = nn.Module()
    model.stages = stages
    assert paths(plan(model)) == {
        "MlpBlock": ["stages.0.0", "stages.0.1", "stages.1.0", "stages.1.1"]
    }
    encoder_decoder = nn.Module()
    encoder_decoder.encoder = nn.Sequential(EncoderBlock(), EncoderBlock())
    encoder_decoder.decoder = nn.Sequential(EncoderBlock(), EncoderBlock())
    assert paths(plan(encoder_decoder)) == {
        "EncoderBlock": ["encoder.0", "encoder.1", "decoder.0", "decoder.1"]
    }


def test_blocks_in_a_module_dict() -> None:
    assert paths(plan(DictModel())) == {
        "MlpBlock": ["blocks.block_0", "blocks.block_1", "blocks.block_2"]
    }


def test_blocks_in_nested_module_lists() -> None:
    assert paths(plan(NestedListModel())) == {
        "MlpBlock": ["stages.0.0", "stages.0.1", "stages.1.0", "stages.1.1"]
    }


def test_stacks_of_one_class_are_looked_into() -> None:
    """T5 without its hint: encoder and decoder are both T5Stack attributes; their blocks are
    the regions, not the stacks, grouped by shape: block 0 of each stack holds the position
    bias table (a shape of its own, looked into: its feed-forward part is the same in both),
    and the decoder's blocks add cross-attention."""
    from engine_zoo import t5

    model = t5()
    model._no_split_modules = None
    assert paths(plan(model)) == {
        "T5LayerFF": ["encoder.block.0.layer.1", "decoder.block.0.layer.2"],
        "T5Block": ["encoder.block.1", "encoder.block.2"],
        "T5Block_2": ["decoder.block.1", "decoder.block.2"],
    }


def test_encoder_and_decoder_stacks_are_two_groups() -> None:
    model = EncoderDecoder().eval()
    twin = copy.deepcopy(model)
    found = plan(model)
    assert paths(found) == {
        "EncoderBlock": ["encoder.layers.0", "encoder.layers.1"],
        "DecoderBlock": ["decoder.layers.0", "decoder.layers.1"],
    }

    torchkiln.compile(model, backend="eager", progress="off")
    with torch.no_grad():  # else block 0's leaf input and the others' add a requires_grad guard
        torch.testing.assert_close(model(hidden()), twin(hidden()))
    assert graphs_compiled() == 2  # one per group, even though both inherit MlpBlock.forward


def test_same_class_name_from_two_modules_makes_two_groups() -> None:
    model = TwoLibraries().eval()
    twin = copy.deepcopy(model)
    found = plan(model)
    assert paths(found) == {"Block": ["first.0", "first.1"], "Block_2": ["second.0", "second.1"]}
    classes = [group["class"] for group in found.to_dict()["groups"]]
    assert classes == ["library_a.layers.Block", "library_b.layers.Block"]

    torchkiln.compile(model, backend="eager", progress="off")
    with torch.no_grad():  # else block 0's leaf input and the others' add a requires_grad guard
        torch.testing.assert_close(model(hidden()), twin(hidden()))
    assert graphs_compiled() == 2


def test_min_repeats() -> None:
    assert paths(plan(Stack(MlpBlock, depth=3), min_repeats=3)) == {
        "MlpBlock": ["layers.0", "layers.1", "layers.2"]
    }
    assert plan(Stack(MlpBlock, depth=3), min_repeats=4).selector == "whole"


# --- hints ---------------------------------------------------------------------------------------


def test_no_split_modules_is_a_hint_the_largest_repeated_level_wins() -> None:
    """The model names Inner, but the Outer blocks around it repeat too: they are the level,
    and the reason says how the hint compares."""
    found = plan(Hinted())
    assert paths(found) == {"Outer": ["blocks.0", "blocks.1", "blocks.2"]}
    assert "level: Outer, the largest modules that repeat" in found.reason
    assert "the model's hint Inner is inside the chosen blocks" in found.reason


def test_repeated_blocks_hint_is_read() -> None:
    """diffusers' spelling: ``_repeated_blocks`` on the model."""
    model = Stack(MlpBlock, depth=3)
    model._repeated_blocks = ("Inner",)  # names a class the model does not have
    assert paths(plan(model)) == {"MlpBlock": ["layers.0", "layers.1", "layers.2"]}
    hinted = Hinted()
    hinted._no_split_modules = []
    hinted._repeated_blocks = ["Outer"]
    found = plan(hinted)
    assert paths(found) == {"Outer": ["blocks.0", "blocks.1", "blocks.2"]}
    assert "(a block class the model names)" in found.groups[0].reason


def test_regions_classes_choose_the_level_for_repeated() -> None:
    """regions.classes is the user's level (not a hint): Inner, although Outer repeats too."""
    found = plan(Hinted(), strategy="repeated", classes=["Inner"])
    assert paths(found) == {"Inner": ["blocks.0.inner", "blocks.1.inner", "blocks.2.inner"]}
    assert "level: Inner, as regions.classes names" in found.reason
    assert paths(plan(Hinted(), strategy="repeated", classes=["Outer"])) == {
        "Outer": ["blocks.0", "blocks.1", "blocks.2"]
    }


def test_transformers_hints() -> None:
    found = plan(llama())
    assert paths(found) == {
        "LlamaDecoderLayer": ["model.layers.0", "model.layers.1", "model.layers.2"]
    }
    assert found.requested == "auto" and found.selector == "repeated"


# --- what happens to the rest, exclusions --------------------------------------------------------


def test_rest_eager_lists_what_stays_eager() -> None:
    found = plan(llama())
    assert [(e.path, e.reason) for e in found.eager] == [
        ("model.embed_tokens", "outside the selected regions (regions.rest=eager)"),
        ("model.norm", "outside the selected regions (regions.rest=eager)"),
        ("lm_head", "outside the selected regions (regions.rest=eager)"),
    ]


def test_rest_leaves_compiles_embeddings_norm_and_lm_head() -> None:
    model = llama()
    twin = copy.deepcopy(model)
    found = plan(model, rest="leaves")
    assert paths(found) == {
        "LlamaDecoderLayer": ["model.layers.0", "model.layers.1", "model.layers.2"],
        "Embedding": ["model.embed_tokens"],
        "LlamaRMSNorm": ["model.norm"],
        "Linear": ["lm_head"],
    }
    assert found.eager == ()

    torchkiln.compile(model, backend="eager", regions={"rest": "leaves"}, progress="off")
    ids = token_ids()
    torch.testing.assert_close(model(ids).logits, twin(ids).logits)
    report = {r.path: r for r in torchkiln.report(model).regions}
    for leaf in ("model.embed_tokens", "model.norm", "lm_head"):
        assert report[leaf].status == "compiled" and report[leaf].graphs == 1, leaf
    assert graphs_compiled() == 4


def test_exclude_globs() -> None:
    found = plan(llama(), exclude=["model.layers.1"])
    assert paths(found) == {"LlamaDecoderLayer": ["model.layers.0", "model.layers.2"]}
    assert ("model.layers.1", "excluded (regions.exclude)") in [
        (e.path, e.reason) for e in found.eager
    ]
    found = plan(llama(), rest="leaves", exclude=["model.layers.[12]", "lm_head"])
    assert paths(found)["LlamaDecoderLayer"] == ["model.layers.0"]
    assert "Linear" not in paths(found)
    assert {e.path for e in found.eager} == {"model.layers.1", "model.layers.2", "lm_head"}


# --- whole, classes, paths -----------------------------------------------------------------------


def test_whole() -> None:
    found = plan(llama(), strategy="whole")
    assert paths(found) == {"LlamaForCausalLM": [""]}
    assert found.selector == "whole" and found.requested == "" and found.eager == ()


def test_classes_globs() -> None:
    found = plan(llama(), strategy="classes", classes=["*DecoderLayer", "*.LlamaRMSNorm"])
    assert paths(found)["LlamaDecoderLayer"] == [
        "model.layers.0",
        "model.layers.1",
        "model.layers.2",
    ]
    # Fully qualified names match too; only the norms outside the layers are outermost.
    assert paths(found)["LlamaRMSNorm"] == ["model.norm"]
    # A glob matching an ancestor selects the ancestor only (regions never nest).
    assert paths(plan(llama(), strategy="classes", classes=["Llama*"])) == {
        "LlamaForCausalLM": [""]
    }


def test_paths_globs() -> None:
    assert paths(plan(llama(), strategy="paths", paths=["model.layers.*"])) == {
        "LlamaDecoderLayer": ["model.layers.0", "model.layers.1", "model.layers.2"]
    }
    found = plan(llama(), strategy="paths", paths=["model.layers.[02]", "lm_head"])
    assert paths(found) == {
        "LlamaDecoderLayer": ["model.layers.0", "model.layers.2"],
        "Linear": ["lm_head"],
    }


def test_a_strategy_that_selects_nothing_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="torchkiln"):
        found = plan(llama(), strategy="classes", classes=["NoSuchBlock"])
    assert found.groups == ()
    assert "nothing matched" in found.reason
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "nothing matched" in caplog.records[0].getMessage()


# --- auto ----------------------------------------------------------------------------------------


def test_auto_falls_back_to_whole_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.LayerNorm(WIDTH)).eval()
    twin = copy.deepcopy(model)
    with caplog.at_level(logging.INFO, logger="torchkiln"):
        found = plan(model)
    assert found.selector == "whole" and found.requested == "auto"
    assert "no repeated blocks found" in found.reason and "whole model" in found.reason
    [record] = caplog.records
    assert record.levelno == logging.WARNING and record.name == "torchkiln"
    assert "compiling the whole model" in record.getMessage()

    torchkiln.compile(model, backend="eager", progress="off")
    torch.testing.assert_close(model(hidden()), twin(hidden()))
    [region] = torchkiln.report(model).regions
    assert region.path == "" and region.graphs == 1


def test_auto_with_blocks_logs_info(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="torchkiln"):
        plan(Stack(MlpBlock))
    [record] = caplog.records
    assert record.levelno == logging.INFO
    assert record.getMessage() == (
        "auto: repeated blocks found: 2x MlpBlock; level: MlpBlock, the largest modules that repeat"
    )


def test_plan_to_dict_shape() -> None:
    found = plan(EncoderDecoder())
    data = json.loads(json.dumps(found.to_dict()))
    assert data == {
        "selector": "repeated",
        "requested": "auto",
        "reason": "auto: repeated blocks found: 2x EncoderBlock, 2x DecoderBlock; "
        "level: EncoderBlock, DecoderBlock, the largest modules that repeat "
        "(not Stack: its 2 instances all differ (class of layers.0))",
        "groups": [
            {
                "name": "EncoderBlock",
                "class": f"{__name__}.EncoderBlock",
                "reason": "2x EncoderBlock, structurally identical",
                "regions": ["encoder.layers.0", "encoder.layers.1"],
            },
            {
                "name": "DecoderBlock",
                "class": f"{__name__}.DecoderBlock",
                "reason": "2x DecoderBlock, structurally identical",
                "regions": ["decoder.layers.0", "decoder.layers.1"],
            },
        ],
        "eager": [{"path": "head", "reason": "outside the selected regions (regions.rest=eager)"}],
        "nested": [],
    }
    assert found.region_count == 4


def test_auto_counts_only_composite_blocks_so_repeated_leaves_compile_whole() -> None:
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH)).eval()
    found = plan(model)
    assert found.selector == "whole" and found.requested == "auto"
    assert [r.path for r in found.regions()] == [""]
