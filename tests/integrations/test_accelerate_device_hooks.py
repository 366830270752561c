"""Models Accelerate dispatched (``cpu_offload``, ``dispatch_model`` with a device map that
offloads to disk) compile regionally and really run compiled: Accelerate's hooks run around each
compiled block call (``torchkiln.accelerate_hooks``), the counting backend and the profiler see
the block graphs run, and outputs are eager's. A hook torchkiln does not lift is named."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import pytest
import torch
from engine_zoo import CountingBackend
from profiler_witness import assert_report_agrees, profiled_block_calls
from torch._dynamo.utils import counters

import torchkiln
from torchkiln._internals.versions import feature_problem
from torchkiln.errors import PartialCompileWarning
from torchkiln.examples import example_inputs, llama

hooks = pytest.importorskip("accelerate.hooks")
big_modeling = pytest.importorskip("accelerate.big_modeling")


def small_llama() -> torch.nn.Module:
    """A default-config Llama (KV cache on, default attention), only the sizes changed."""
    return llama(depth=3, hidden_size=64, heads=4, kv_heads=2, intermediate_size=128,
                 vocab_size=256)  # fmt: skip


def eager_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return copy.deepcopy(model)(ids).logits


def test_cpu_offload_runs_every_block_compiled_with_its_weights_offloaded() -> None:
    model = small_llama()
    ids = example_inputs(model, batch=2, seq=8)
    expected = eager_logits(model, ids)
    big_modeling.cpu_offload(model, execution_device=torch.device("cpu"))
    layers = list(model.model.layers)
    assert layers[0].self_attn.q_proj.weight.device.type == "meta"  # offloaded

    counting = CountingBackend()
    torchkiln.compile(model, backend="counting", plugins=[counting])
    with torch.no_grad():
        seen = profiled_block_calls(layers, lambda: model(ids))
        again = model(ids).logits

    report = torchkiln.report(model)
    assert [r.path for r in report.regions] == [f"model.layers.{i}" for i in range(3)]
    assert counting.compiled == report.total_graphs == 1  # one graph, no break at any layer
    assert counters["graph_break"] == {}
    assert len(counting.runs) == 6  # every block call of both forwards ran the graph
    assert_report_agrees(report, layers, seen)
    assert [s.compiled for s in seen] == [1, 1, 1]
    torch.testing.assert_close(again, expected, rtol=1e-5, atol=1e-5)
    assert layers[0].self_attn.q_proj.weight.device.type == "meta"  # offloaded again after
    assert report.notes == (
        "LlamaDecoderLayer: Accelerate hooks run around each compiled call: AlignDevicesHook of "
        "9 submodules a block (weights loaded before the call, offloaded after)",
    )
    assert "note: LlamaDecoderLayer: Accelerate hooks run" in str(report)

    wrapper = hooks.add_hook_to_module  # decompile gives every module its hook wrapper back
    torchkiln.decompile(model)
    q_proj = layers[0].self_attn.q_proj
    assert (
        q_proj.__dict__["forward"].func.__qualname__ == f"{wrapper.__name__}.<locals>.new_forward"
    )
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, expected, rtol=1e-5, atol=1e-5)


def test_a_device_map_with_a_block_on_disk(tmp_path: Path) -> None:
    model = small_llama()
    ids = example_inputs(model, batch=1, seq=8)
    expected = eager_logits(model, ids)
    device_map = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "cpu",
                  "model.layers.2": "disk", "model.norm": "cpu", "model.rotary_emb": "cpu",
                  "lm_head": "cpu"}  # fmt: skip
    big_modeling.dispatch_model(model, device_map=device_map, offload_dir=str(tmp_path))

    counting = CountingBackend()
    torchkiln.compile(model, backend="counting", plugins=[counting])
    with torch.no_grad():
        got = model(ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)

    report = torchkiln.report(model)
    # The block on disk holds its weights on the meta device until its hook loads them: a
    # structure of its own, so it stays eager (and says so); the two on the CPU share a graph.
    assert [r.path for r in report.regions] == ["model.layers.0", "model.layers.1"]
    assert counting.compiled == report.total_graphs == 1 and len(counting.runs) == 2
    assert any(path == "model.layers.2" for path, _ in report.eager)
    # Issue 41: the two blocks on the CPU are resident; the note said their weights were
    # "loaded before the call, offloaded after".
    assert report.notes[0] == (
        "LlamaDecoderLayer: Accelerate hooks run around each compiled call: the block's own "
        "hook (2 of 2 blocks, AlignDevicesHook: inputs moved to cpu); AlignDevicesHook of 11 "
        "submodules a block (weights stay on cpu: nothing loaded or offloaded)"
    )


def test_a_device_map_onto_one_device_says_its_weights_stay() -> None:
    """Issue 41: blocks a ``device_map`` keeps resident were said to have their weights
    "loaded before the call, offloaded after". The witness: every weight of the blocks is the
    same tensor storage, on the CPU, before and after the call."""
    model = small_llama()
    ids = example_inputs(model, batch=1, seq=8)
    expected = eager_logits(model, ids)
    device_map = {name: "cpu" for name in ("model.embed_tokens", "model.layers.0",
                  "model.layers.1", "model.layers.2", "model.norm", "model.rotary_emb",
                  "lm_head")}  # fmt: skip
    big_modeling.dispatch_model(model, device_map=device_map, force_hooks=True)
    weights = list(model.model.layers.parameters())
    before = [(w.device.type, w.data_ptr()) for w in weights]
    torchkiln.compile(model, backend="eager", progress="off")
    with torch.no_grad():
        got = model(ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert [(w.device.type, w.data_ptr()) for w in weights] == before  # never moved
    assert torchkiln.report(model).notes == (
        "LlamaDecoderLayer: Accelerate hooks run around each compiled call: the block's own "
        "hook (3 of 3 blocks, AlignDevicesHook: inputs moved to cpu); AlignDevicesHook of 11 "
        "submodules a block (weights stay on cpu: nothing loaded or offloaded)",
    )


class ScaleInput(hooks.ModelHook):
    """A hook of the user's own kind: it changes the module's input, so it is not lifted."""

    def pre_forward(self, module: torch.nn.Module, *args: object, **kwargs: object) -> object:
        return (args[0] * 0.5, *args[1:]), kwargs


def test_a_hook_of_another_kind_stays_in_the_trace_and_is_named() -> None:
    model = small_llama()
    ids = example_inputs(model, batch=1, seq=8)
    for layer in model.model.layers:
        hooks.add_hook_to_module(layer.mlp.down_proj, ScaleInput())
    expected = eager_logits(model, ids)

    counting = CountingBackend()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torchkiln.compile(model, backend="counting", plugins=[counting])
    with torch.no_grad():
        got = model(ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    named = [str(w.message) for w in caught if issubclass(w.category, PartialCompileWarning)]
    assert named == [
        "group 'LlamaDecoderLayer': Accelerate hooks traced with the block: ScaleInput on "
        "mlp.down_proj; Dynamo traces them, which may break the block's graph (each kind is "
        "named in torchkiln.report)"
    ]
    report = torchkiln.report(model)
    assert report.notes == (
        "LlamaDecoderLayer: Accelerate hooks traced with the block: ScaleInput on mlp.down_proj",
    )
    assert counting.compiled == report.total_graphs  # the report's graphs are the backend's


def test_the_whole_model_offloaded_keeps_its_layers_hooks_in_the_trace() -> None:
    """Lifting every layer's hook of the root would load the whole model's weights at once:
    the root's own hook runs around the call, its layers' hooks stay where Accelerate put
    them (Dynamo breaks the graph at each, as with Accelerate), and the report says both."""
    model = small_llama()
    ids = example_inputs(model, batch=1, seq=8)
    expected = eager_logits(model, ids)
    big_modeling.cpu_offload(model, execution_device=torch.device("cpu"))
    counting = CountingBackend()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PartialCompileWarning)
        torchkiln.compile(model, backend="counting", regions="whole", plugins=[counting])
    with torch.no_grad():
        got = model(ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    report = torchkiln.report(model)
    assert report.notes[0] == (
        "LlamaForCausalLM: Accelerate hooks run around each compiled call: the block's own "
        "hook (1 of 1 blocks, AlignDevicesHook: outputs moved back)"
    )
    assert report.notes[1].startswith(
        "LlamaForCausalLM: Accelerate hooks traced with the block: AlignDevicesHook on lm_head"
    )
    assert counters["graph_break"] and counting.compiled == report.total_graphs > 1


@pytest.mark.skipif(
    feature_problem("tiered compilation") is not None,
    reason=str(feature_problem("tiered compilation")),
)
def test_tiers_stay_regional_on_a_dispatched_model_and_say_why() -> None:
    """A builder process cannot receive Accelerate's hooks (local functions, weights kept
    outside the model): the tiers stop at the first call, named, and the blocks still serve
    compiled."""
    model = small_llama()
    ids = example_inputs(model, batch=1, seq=8)
    expected = eager_logits(model, ids)
    big_modeling.cpu_offload(model, execution_device=torch.device("cpu"))
    torchkiln.compile(model, tiered=True, progress="off")
    with torch.no_grad():
        got = model(ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    tiers = torchkiln.report(model).tiers
    assert (tiers.state, tiers.serving, tiers.calls["regional"]) == ("failed", "regional", 1)
    assert tiers.reason.startswith("Accelerate's hooks (")
    assert "a model loaded with a device map or offloaded stays regional" in tiers.reason
