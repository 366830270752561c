"""Per-layer caches beyond ``Cache.update`` (issue 24): state-space conv and recurrent states
(Mamba), a layer index under another name (GPT-Neo's ``layer_id``, or any name), and a cache a
plugin declares with ``declare_layer_caches``. The depth-12/16 checks are in the slow zoo."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
import torch
from decoder_zoo import BY_NAME, eager_regions, run
from torch import nn
from torch._dynamo.utils import counters

import torchkiln
from torchkiln.plugin import LayerCacheSpec, PluginError, hookimpl
from torchkiln.plugins.layer_cache_views import find_layer_indices


@pytest.fixture(autouse=True)
def fresh_dynamo(reset_dynamo: None, torchkiln_clean_environment: None) -> Iterator[None]:
    yield


def test_mamba_generate_runs_every_block_call_compiled() -> None:
    """Mamba's blocks call get/update_conv_state and get/update_recurrent_state with their
    index. At depth 9 (past the recompile limit of 8): no eager region, and, as the counting
    backend saw it, every call of every block ran one compiled graph; forward logits and
    token ids equal eager's. (Before: one graph per layer, then layer 8 eager.)"""
    pytest.importorskip("transformers")
    outcome = run(BY_NAME["mamba"], 9, ("forward", "generate"), witness=True)
    assert outcome.mismatches() == []
    assert outcome.eager_regions == ()
    assert outcome.eager_calls() == []
    assert {runs for calls in outcome.graph_runs.values() for runs in calls} == {1}
    assert outcome.graphs <= 4 and outcome.breaks == 0


def test_gpt_neo_blocks_are_indexed_by_layer_id() -> None:
    """GPT-Neo keeps its index in ``layer_id`` (its attention modules hold it)."""
    pytest.importorskip("transformers")
    model = BY_NAME["gpt_neo"].build(4)
    blocks = list(model.transformer.h)
    found = find_layer_indices(blocks, [f"transformer.h.{i}" for i in range(4)], ("layer_idx",))
    assert found is not None
    indices, names = found
    assert [(index.attribute, index.value) for index in indices] == [
        ("layer_id", i) for i in range(4)
    ]
    assert all(index.holder in set(block.modules()) for index, block in zip(indices, blocks))
    assert names == ("layer_id",)


class Numbered(nn.Module):
    def __init__(self, number: int, width: int = 4) -> None:
        super().__init__()
        self.inner = nn.Linear(width, width)
        self.inner.slot = number  # an index under a name nobody declared
        self.width = width  # the same in every block: not an index


def test_an_undeclared_attribute_that_numbers_the_blocks_is_the_index() -> None:
    blocks = [Numbered(i) for i in range(3)]
    found = find_layer_indices(blocks, ["layers.0", "layers.1", "layers.2"], ("layer_idx",))
    assert found is not None
    assert [(i.attribute, i.holder, i.value) for i in found[0]] == [
        ("slot", block.inner, n) for n, block in enumerate(blocks)
    ]


def test_no_index_without_an_attribute_that_numbers_the_blocks() -> None:
    same = [Numbered(0), Numbered(0)]  # two blocks with one value: not a numbering
    assert find_layer_indices(same, ["a.0", "a.1"], ("layer_idx",)) is None
    # One block cannot show what numbers it: only a declared name counts.
    assert find_layer_indices([Numbered(3)], ["a.3"], ("layer_idx",)) is None
    assert find_layer_indices([Numbered(3)], ["a.3"], ("slot",)) is not None


class Memory:
    def __init__(self, depth: int) -> None:
        self.stores: list[list[torch.Tensor]] = [[] for _ in range(depth)]

    def remember(self, x: torch.Tensor, block_no: int) -> torch.Tensor:
        store = self.stores[block_no]
        store.append(x)
        return x + len(store)


class Block(nn.Module):
    def __init__(self, block_index: int) -> None:
        super().__init__()
        self.block_index = block_index
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, memory: Memory | None = None) -> torch.Tensor:
        if memory is not None:
            x = memory.remember(x, self.block_index)
        return torch.relu(self.linear(x))


MEMORY = LayerCacheSpec(
    "memory",
    cache_type=Memory,
    layers="stores",
    methods=("remember",),
    index_parameter="block_no",
    cache_parameters=("memory",),
)


class Declares:
    def __init__(self, spec: LayerCacheSpec) -> None:
        self.spec = spec

    @hookimpl
    def declare_layer_caches(self) -> list[LayerCacheSpec]:
        return [self.spec]


def memory_graphs(spec: LayerCacheSpec | None, depth: int = 10) -> tuple[int, list[int]]:
    model = nn.Sequential(*[Block(i) for i in range(depth)])
    manager = torchkiln.PluginManager(entry_points=False, env={})
    if spec is not None:
        manager.register(Declares(spec), name="memory-cache")
    torchkiln.compile(model, backend="eager", plugins=manager, progress="off")
    memory = Memory(depth)
    with torch.no_grad():
        x = torch.randn(2, 8)
        for block in model:
            x = block(x, memory=memory)
    return counters["stats"]["unique_graphs"], [len(store) for store in memory.stores]


def test_a_declared_cache_compiles_one_graph_and_without_the_declaration_one_per_block() -> None:
    """The plugin's declaration is all it takes (the index attribute is found undeclared);
    without it every block indexes the list in the trace and recompiles."""
    assert memory_graphs(MEMORY) == (1, [1] * 10)
    torch._dynamo.reset()
    counters.clear()
    graphs, stores = memory_graphs(None)
    assert stores == [1] * 10 and graphs >= 8


def test_a_declared_method_without_the_index_parameter_is_refused() -> None:
    bad = LayerCacheSpec("memory", Memory, layers="stores", methods=("remember",))
    with pytest.raises(PluginError, match=r"layer cache 'memory': Memory.remember .*'layer_idx'"):
        memory_graphs(bad)


def test_a_declaration_is_checked_when_built() -> None:
    with pytest.raises(TypeError, match="tuple of names, got the string 'memory'"):
        LayerCacheSpec("m", Memory, cache_parameters="memory")
    with pytest.raises(TypeError, match="'module:QualifiedName'"):
        LayerCacheSpec("m", "transformers.Cache")


def test_a_cache_list_that_grows_as_layers_run_costs_no_graph_per_layer() -> None:
    """``DynamicCache()`` without a config adds its layers one ``update`` at a time; the
    adapter adds them up to the model's depth first, so every block sees one list length:
    one graph at depth 10, nothing eager, logits equal eager's."""
    pytest.importorskip("transformers")
    from transformers import DynamicCache

    model = BY_NAME["llama"].build(10)
    compiled = copy.deepcopy(model)
    ids = torch.randint(1, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(ids, cache=DynamicCache()).logits
        torchkiln.compile(compiled, backend="eager", progress="off")
        cache = DynamicCache()
        actual = compiled(ids, cache=cache).logits
    torch.testing.assert_close(actual, expected)
    assert len(cache.layers) == 10
    assert counters["stats"]["unique_graphs"] == 1
    assert eager_regions(compiled) == ()
