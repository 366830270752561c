"""``torchkiln.transformers_nested``: hierarchical compilation of a default-config Llama (KV
cache on) traces the decoder layer once and stamps the trace out at every other layer, with
outputs and generated tokens equal to eager's."""

from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.utils import compilation_time_metrics

import torchkiln
from torchkiln._internals import versions
from torchkiln.examples import example_inputs, llama
from torchkiln.plugin import PartialCompileWarning
from torchkiln.plugin_host.plugin_manager import PluginManager
from torchkiln.plugins.transformers_nested import NestedLayerCache, flatten_call, unflatten_call
from torchkiln.testing import isolated_plugin_manager

pytest.importorskip("transformers")

NESTED = "torchkiln.transformers_nested"


@pytest.fixture(autouse=True)
def fresh_dynamo(reset_dynamo: None) -> None:
    """Trace counts are this test's own (``torch._dynamo.reset()`` clears them)."""


def small_llama(depth: int) -> torch.nn.Module:
    """The default LlamaConfig (KV cache on), small sizes."""
    return llama(depth, hidden_size=64, heads=4, kv_heads=2, intermediate_size=128,
                 vocab_size=256)  # fmt: skip


TRACES_RECORDED = versions.release_tuple(torch.__version__) >= (2, 13)
"""torch records the timing metrics :func:`traces` reads from 2.13 on; on 2.11 and 2.12 the tests
below check outputs and tokens only (the graph itself cannot tell a trace from a reuse: both
runs leave one subgraph called at every layer)."""


def assert_traces(expected: tuple[int, int], message: str = "") -> None:
    if TRACES_RECORDED:
        assert traces() == expected, message


def traces() -> tuple[int, int]:
    """(nested subgraphs Dynamo traced, call sites that reused a trace) since the reset."""
    return (
        len(compilation_time_metrics.get("invoke_subgraph_trace", [])),
        len(compilation_time_metrics.get("invoke_subgraph_reuse_stamp_out", [])),
    )


def without_nested() -> PluginManager:
    return PluginManager(entry_points=False, env={"TORCHKILN_DISABLED_PLUGINS": NESTED})


def compile_hierarchical(model: torch.nn.Module, backend: str = "eager", plugins=None) -> None:
    torchkiln.compile(model, regions="hierarchical", backend=backend, progress="off",
                      plugins=plugins or isolated_plugin_manager())  # fmt: skip


@pytest.mark.parametrize("depth", [2, 5])
def test_the_decoder_layer_is_traced_once_with_the_kv_cache_on(depth: int) -> None:
    model = small_llama(depth)
    assert model.config.use_cache
    inputs = example_inputs(model, batch=2, seq=12)
    with torch.no_grad():
        expected = model(inputs)
    compile_hierarchical(model)
    with torch.no_grad():
        actual = model(inputs)
    assert_traces((1, depth - 1))
    assert torch.equal(actual.logits, expected.logits)
    for layer, (got, want) in enumerate(zip(actual.past_key_values.layers,
                                            expected.past_key_values.layers, strict=True)):  # fmt: skip
        assert torch.equal(got.keys, want.keys), layer
        assert torch.equal(got.values, want.values), layer
    report = torchkiln.report(model)
    assert [(r.path, r.graphs, r.graph_breaks) for r in report.regions] == [("", 1, {})]


def test_without_the_plugin_every_layer_is_traced() -> None:
    """The problem this plugin solves: the cache update is a side effect, so no reuse."""
    depth = 3
    model = small_llama(depth)
    compile_hierarchical(model, plugins=without_nested())
    with torch.no_grad():
        model(example_inputs(model, batch=1, seq=8))
    assert_traces((depth, 0))


@pytest.mark.parametrize("depth", [2, 4])
def test_generate_gives_eager_tokens_and_traces_independent_of_depth(depth: int) -> None:
    model = small_llama(depth)
    inputs = example_inputs(model, batch=1, seq=8)
    with torch.no_grad():
        expected = model.generate(inputs, max_new_tokens=8, do_sample=False)
    compile_hierarchical(model)
    with torch.no_grad():
        actual = model.generate(inputs, max_new_tokens=8, do_sample=False)
    assert torch.equal(actual, expected)
    if not TRACES_RECORDED:
        return
    traced, stamped = traces()
    # prefill (no past), then decode steps until the shapes go dynamic: one trace each,
    # the same number at every depth; every other layer reuses it
    assert traced == 3
    assert stamped == traced * (depth - 1)


def test_a_training_step_with_labels_matches_eager() -> None:
    model = small_llama(3).train()
    twin = copy.deepcopy(model)
    inputs = example_inputs(model, batch=2, seq=10)
    compile_hierarchical(model, backend="aot_eager")
    loss = model(inputs, labels=inputs).loss
    expected = twin(inputs, labels=inputs).loss
    torch.testing.assert_close(loss, expected, rtol=0, atol=0)
    loss.backward()
    expected.backward()
    for (name, p), (_, q) in zip(model.named_parameters(), twin.named_parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-7, msg=name)
    assert_traces((1, 2))


def test_a_cache_layer_it_does_not_reproduce_falls_back_and_says_so(
    recwarn: pytest.WarningsRecorder,
) -> None:
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    class TaggedLayer(DynamicLayer):
        """A DynamicLayer subclass: one whose update the plugin cannot vouch for."""

    model = small_llama(3)
    inputs = example_inputs(model, batch=1, seq=6)

    def run() -> torch.Tensor:
        cache = DynamicCache()
        cache.layer_class_to_replicate = TaggedLayer
        with torch.no_grad():
            return model(inputs, cache=cache).logits

    expected = run()
    compile_hierarchical(model)
    assert torch.equal(run(), expected)
    err = "\n".join(str(w.message) for w in recwarn if w.category is PartialCompileWarning)
    assert err.count("torchkiln: transformers nested blocks:") == 1
    assert "DynamicCache holds a TaggedLayer, not a DynamicLayer" in err
    assert_traces((3, 0), "the fallback is the plain hierarchical one: every layer traced")


def test_decompile_removes_the_split_forwards() -> None:
    model = small_llama(2)
    compile_hierarchical(model)
    assert all("forward" in layer.__dict__ for layer in model.model.layers)
    torchkiln.decompile(model)
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_the_nested_view_concatenates_like_dynamic_layer() -> None:
    first, second = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 1, 4)
    view = NestedLayerCache(None, None)
    assert view.get_seq_length() == 0
    keys, values = view.update(first, first * 2, 0)
    assert torch.equal(keys, first) and torch.equal(values, first * 2)
    view = NestedLayerCache(keys, values)
    keys, _ = view.update(second, second, 0)
    assert torch.equal(keys, torch.cat([first, second], dim=-2))
    assert view.get_seq_length() == 4
    with pytest.raises(AttributeError, match="answers update and get_seq_length only"):
        view.is_sliding  # noqa: B018


def test_a_call_is_flattened_to_leaves_and_rebuilt() -> None:
    hidden, cos, sin = torch.ones(1), torch.zeros(1), torch.full((1,), 2.0)
    args = (hidden, None)
    kwargs = {"position_embeddings": (cos, sin), "use_cache": True, "extra": [hidden], "m": {}}
    spec, leaves = flatten_call(args, kwargs)
    assert spec == ":,:,position_embeddings:t2,use_cache:,extra:l1,m:"
    assert leaves == [hidden, None, cos, sin, True, hidden, {}]
    rebuilt_args, rebuilt_kwargs = unflatten_call(spec, tuple(leaves))
    assert rebuilt_args == list(args)
    assert rebuilt_kwargs == kwargs
    assert unflatten_call(*flatten_call((), {})) == ([], {})
