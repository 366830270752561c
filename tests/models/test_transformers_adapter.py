"""The transformers model adapter on a default Llama: one compiled block whatever the depth,
with the KV cache on, for the forward, a training step, generate() and static-cache generate;
output capture, padding and varying lengths; caches the adapter cannot split; decompile."""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator

import pytest
import torch
import torch._dynamo
from decoder_zoo import BY_NAME, WORKLOADS, eager_regions, run, same, token_ids
from torch._dynamo.utils import counters

import torchkiln
import torchkiln.examples
from torchkiln.plugin import PartialCompileWarning

pytest.importorskip("transformers")

LLAMA = BY_NAME["llama"]


@pytest.fixture(autouse=True)
def fresh_dynamo(reset_dynamo: None, torchkiln_clean_environment: None) -> Iterator[None]:
    yield


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_default_llama_compiles_the_same_graphs_at_depth_12_and_24(workload: str) -> None:
    """The issue's acceptance test: same graph count at both depths (at most 8), no eager
    region, results identical to eager (logits and gradients closely, token ids exactly)."""
    outcomes = {depth: run(LLAMA, depth, (workload,)) for depth in (12, 24)}
    for depth, outcome in outcomes.items():
        assert outcome.eager_regions == (), (depth, outcome.eager_regions)
        assert outcome.mismatches() == [], depth
        assert outcome.breaks == 0, depth
    assert outcomes[12].graphs == outcomes[24].graphs == GRAPHS[workload]


GRAPHS = {"forward": 1, "train": 1, "generate": 3, "generate_static": 2}
"""Graphs per workload. ``layer_idx`` is traced as symbolic from the first compile (the
adapter's trace settings): without that each workload compiles one graph more."""


def test_without_the_adapter_layers_fall_back_to_eager(pm: torchkiln.PluginManager) -> None:
    """What the adapter fixes: blocked, every layer compiles its own graph until Dynamo's
    recompile limit, then the rest run eagerly (so the test above can fail)."""
    pm.set_blocked("torchkiln.transformers_models")
    model = LLAMA.build(12)
    torchkiln.compile(model, backend="eager", plugins=pm)
    WORKLOADS["forward"](model, token_ids())
    assert eager_regions(model) == tuple(f"model.layers.{i}" for i in range(8, 12))


def llama_with(depth: int = 12, **config: object) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    sizes = {"num_hidden_layers": depth, "vocab_size": 128, **LLAMA.sizes}
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**sizes, **config)).eval()


def compare(model: torch.nn.Module, call: object, max_graphs: int) -> None:
    """``call(model)`` eagerly and compiled: equal results, few graphs, nothing eager."""
    compiled = copy.deepcopy(model)
    expected = call(model)  # type: ignore[operator]
    torchkiln.compile(compiled, backend="eager")
    actual = call(compiled)  # type: ignore[operator]
    assert same(expected, actual, atol=1e-5, rtol=1e-4)
    assert eager_regions(compiled) == ()
    assert sum(counters["graph_break"].values()) == 0
    assert counters["stats"]["unique_graphs"] <= max_graphs


def test_output_hidden_states_and_attentions_compile_one_block() -> None:
    """Capture hooks run inside the block (the attention's); they neither break the graph nor
    add a graph per layer (their lists would grow per layer)."""
    ids = token_ids()

    def both(model: torch.nn.Module) -> list[torch.Tensor]:
        with torch.no_grad():
            plain = model(ids)
            out = model(ids, output_hidden_states=True, output_attentions=True)
        assert len(out.hidden_states) == 13 and len(out.attentions) == 12
        return [plain.logits, out.logits, *out.hidden_states, *out.attentions]

    compare(llama_with(attn_implementation="eager"), both, max_graphs=4)


def test_padding_and_varying_lengths_add_no_graph_per_layer() -> None:
    ids = token_ids(batch=2, seq=12)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding, as generate() expects

    def calls(model: torch.nn.Module) -> list[torch.Tensor]:
        with torch.no_grad():
            logits = [model(ids[:, :length]).logits for length in (12, 7, 9)]
            padded = model(ids, attention_mask=mask).logits
            tokens = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
        return [*logits, padded, tokens]

    compare(llama_with(), calls, max_graphs=8)


GENERATE_OPTIONS = {
    "beam search": {"num_beams": 2},
    "sampling": {"do_sample": True, "top_k": 20},
    "penalties": {"repetition_penalty": 1.3, "no_repeat_ngram_size": 2},
    "scores and hidden states": {
        "output_scores": True,
        "output_hidden_states": True,
        "return_dict_in_generate": True,
    },
}


@pytest.mark.parametrize("options", list(GENERATE_OPTIONS.values()), ids=list(GENERATE_OPTIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_generate_options_users_pass_keep_the_graphs_of_plain_generate(
    options: dict[str, object], dtype: torch.dtype
) -> None:
    """Beam search (the cache reordered between steps), sampling, logits processors and
    returned scores and hidden states change what happens around the blocks, not inside them:
    3 graphs at depth 12 and 13 (prefill, first decode step, symbolic length), as plain
    ``generate()``, nothing eager, no break, the same token ids as eager (same seed)."""
    ids = token_ids()
    mask = torch.ones_like(ids)
    graphs = {}
    for depth in (12, 13):
        model = llama_with(depth).to(dtype)
        compiled = copy.deepcopy(model)
        torch._dynamo.reset()
        counters.clear()
        torchkiln.compile(compiled, backend="eager")
        results = []
        for target in (model, compiled):
            torch.manual_seed(5)
            with torch.no_grad():
                out = target.generate(ids, attention_mask=mask, max_new_tokens=6, **options)
            results.append(out.sequences if hasattr(out, "sequences") else out)
        assert torch.equal(results[0], results[1]), depth
        assert eager_regions(compiled) == ()
        assert sum(counters["graph_break"].values()) == 0
        graphs[depth] = counters["stats"]["unique_graphs"]
    assert graphs == {12: GRAPHS["generate"], 13: GRAPHS["generate"]}


_RECORDED: list[torch.fx.GraphModule] = []


def _recording_backend(graph: torch.fx.GraphModule, example_inputs: object) -> object:
    _RECORDED.append(graph)
    return graph.forward


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non-reentrant"])
def test_gradient_checkpointing_keeps_one_block_and_checkpoints_inside_it(reentrant: bool) -> None:
    """``model.gradient_checkpointing_enable()`` (the Trainer's ``gradient_checkpointing=True``):
    transformers wraps the layer class's ``forward`` in ``torch.utils.checkpoint``, so the
    compiled block traces the checkpoint itself. One graph at depth 12 and 24, nothing eager,
    gradients equal eager's (checkpointed too), and the graph keeps the checkpoint region
    (``tag_activation_checkpoint``) for the partitioner to recompute in the backward."""
    if "kiln_test_recording" not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(_recording_backend, name="kiln_test_recording")
    ids = token_ids()
    graphs = {}
    for depth in (12, 24):
        model = llama_with(depth).train()
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": reentrant}
        )
        compiled = copy.deepcopy(model)
        expected = model(ids, labels=ids).loss
        expected.backward()
        torch._dynamo.reset()
        counters.clear()
        _RECORDED.clear()
        torchkiln.compile(compiled, backend="kiln_test_recording")
        for _ in range(2):  # a second step reuses the graph
            compiled.zero_grad()
            actual = compiled(ids, labels=ids).loss
            actual.backward()
        torch.testing.assert_close(actual, expected)
        for (name, ours), theirs in zip(
            compiled.named_parameters(), model.parameters(), strict=True
        ):
            torch.testing.assert_close(ours.grad, theirs.grad, msg=name)
        assert eager_regions(compiled) == ()
        assert sum(counters["graph_break"].values()) == 0
        graphs[depth] = counters["stats"]["unique_graphs"]
        checkpoints = [
            node
            for graph in _RECORDED
            for node in graph.graph.nodes
            if node.target is torch.ops.higher_order.tag_activation_checkpoint
        ]
        assert len(_RECORDED) == 1 and len(checkpoints) == 1, depth
    assert graphs == {12: 1, 24: 1}


def test_a_cache_that_overrides_update_runs_it_outside_the_graph(
    recwarn: pytest.WarningsRecorder,
) -> None:
    """An unknown cache degrades visibly: one graph break per block call, graphs still
    independent of depth, a message naming the cache and why, results equal to eager."""
    from transformers import DynamicCache

    class LoggingCache(DynamicCache):
        def update(self, key_states, value_states, layer_idx, *args, **kwargs):  # type: ignore[no-untyped-def]
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    ids = token_ids()
    graphs = {}
    for depth in (12, 13):
        model = llama_with(depth)
        compiled = copy.deepcopy(model)
        with torch.no_grad():
            expected = model(ids, cache=LoggingCache(config=model.config)).logits
            torch._dynamo.reset()
            counters.clear()
            torchkiln.compile(compiled, backend="eager")
            actual = compiled(ids, cache=LoggingCache(config=model.config)).logits
        torch.testing.assert_close(actual, expected)
        assert eager_regions(compiled) == ()
        graphs[depth] = counters["stats"]["unique_graphs"]
    assert graphs[12] == graphs[13]
    said = [str(w.message) for w in recwarn if w.category is PartialCompileWarning]
    assert any("LoggingCache overrides Cache.update" in text for text in said)


def test_decompile_removes_the_adapter() -> None:
    model = llama_with()
    plain = copy.deepcopy(model)
    torchkiln.compile(model, backend="eager")
    WORKLOADS["generate"](model, token_ids())
    torchkiln.decompile(model)
    assert all("forward" not in layer.__dict__ for layer in model.model.layers)
    torch._dynamo.reset()
    counters.clear()
    assert same(
        WORKLOADS["generate"](model, token_ids()),
        WORKLOADS["generate"](plain, token_ids()),
        0,
        0,
    )
    assert counters["stats"]["unique_graphs"] == 0


def test_models_outside_transformers_are_left_alone() -> None:
    from torchkiln.plugins.transformers_models import TRANSFORMERS_CACHE, prepare_group

    # The toy's blocks take no cache; a whole-model region holds many layer indices, not one.
    for model, regions in ((torchkiln.examples.toy(depth=2), "repeated"), (llama_with(2), "whole")):
        plan = torchkiln.plan(model, regions=regions)
        assert plan.groups
        for group in plan.groups:
            assert prepare_group(model, plan, group, None, (TRANSFORMERS_CACHE,)) is None  # type: ignore[arg-type]


def test_compiling_a_model_outside_transformers_imports_no_transformers() -> None:
    """The adapter looks at class module names only: transformers stays unimported."""
    import subprocess

    code = (
        "import sys, torch, torchkiln, torchkiln.examples\n"
        "model = torchkiln.compile(torchkiln.examples.toy(depth=2), backend='eager', progress='off')\n"
        "model(torch.zeros(1, 4, dtype=torch.long))\n"
        "print('transformers' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


def test_a_cache_class_is_decided_once_and_each_cache_is_checked_per_call() -> None:
    """The adapter decides a cache class at compile time (its later calls are one lookup), but
    what belongs to one cache object (offloading, a missing entry) is checked on every call."""
    from transformers import DynamicCache

    from torchkiln.plugins.layer_cache_views import LayerView, find_layer_indices
    from torchkiln.plugins.transformers_models import TRANSFORMERS_CACHE, block_adapter

    model = torchkiln.examples.llama(depth=2)
    blocks = list(model.model.layers)
    found = find_layer_indices(blocks, ["model.layers.0", "model.layers.1"], ("layer_idx",))
    assert found is not None
    adapter = block_adapter("LlamaDecoderLayer", blocks, found[0], (TRANSFORMERS_CACHE,), 2)
    assert adapter is not None and DynamicCache in adapter.splits
    cache = DynamicCache(config=model.config)
    view = adapter.layer_view(blocks[1], cache)
    assert isinstance(view, LayerView) and "Outside" not in type(view).__name__
    assert view._torchkiln_own is cache.layers[1]
    cache.offloading = True  # the same class, offloading now: run outside the graph, said once
    with pytest.warns(PartialCompileWarning, match="offloads layers"):
        offloaded = adapter.layer_view(blocks[1], cache)
    assert type(offloaded).__name__ == "DynamicCacheOutsideLayerView"
    assert adapter.layer_view(blocks[0], "not a cache") == "not a cache"
