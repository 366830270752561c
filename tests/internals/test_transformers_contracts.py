"""Contracts of ``torchkiln._internals.transformers``: each adapter function works on the
installed transformers (and this torch). One tiny Llama model, built once."""

from __future__ import annotations

import pytest

from torchkiln._internals import transformers as hf

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def model():  # type: ignore[no-untyped-def]
    """The decoder (``LlamaModel``, the class that records outputs) of the built-in example."""
    from torchkiln.examples import llama

    return llama(depth=1, hidden_size=16, heads=2, kv_heads=2, intermediate_size=32).model


def test_can_record_registry(model) -> None:  # type: ignore[no-untyped-def]
    registry = hf.can_record_registry()
    assert isinstance(registry, dict)
    assert hf.can_record_outputs(model) in list(dict.values(registry))  # __init__ registered it


def test_can_record_outputs(model) -> None:  # type: ignore[no-untyped-def]
    outputs = hf.can_record_outputs(model)
    assert isinstance(outputs, dict) and "hidden_states" in outputs
    assert hf.can_record_outputs(object()) is None


def test_active_collector() -> None:
    collector = hf.active_collector()
    for attribute in ("context_var", "global_var", "compiling"):  # what the block adapter sets
        assert hasattr(collector, attribute), attribute
    assert collector.context_var.get() is None  # no output collected outside a model's call


def test_no_split_modules(model) -> None:  # type: ignore[no-untyped-def]
    assert list(hf.no_split_modules(model)) == ["LlamaDecoderLayer"]
    assert hf.no_split_modules(object()) is None


def test_replace_can_record_registry(model) -> None:  # type: ignore[no-untyped-def]
    registry = hf.can_record_registry()
    assert registry is not None
    before = list(dict.items(registry))
    try:
        hf.replace_can_record_registry(registry, [(model, {"x": 1}), *before])
        assert next(iter(dict.items(registry))) == (model, {"x": 1})  # in the order given
        assert len(dict.keys(registry)) == len(before) + (model not in dict(before))
    finally:
        hf.replace_can_record_registry(registry, before)
    assert list(dict.items(registry)) == before


def test_register_can_record(model) -> None:  # type: ignore[no-untyped-def]
    registry: dict[object, object] = {}
    hf.register_can_record(registry, model)
    hf.register_can_record(registry, object())  # declares nothing: left out
    assert registry == {model: hf.can_record_outputs(model)}


def test_a_block_call_collects_globally_and_the_collector_is_restored() -> None:
    collector = hf.active_collector()
    seen: list[tuple[object, bool]] = []

    def block() -> str:
        seen.append((collector.global_var, collector.compiling))
        return "out"

    assert collector.context_var.get() is None and not collector.compiling
    assert hf.call_collecting_per_block(collector, block) == "out"
    assert seen == [(None, True)]  # no model call collecting: nothing to hand over
    assert not collector.compiling and collector.global_var is None


def test_a_block_collects_into_fresh_lists_appended_to_the_calls() -> None:
    collector = hf.active_collector()
    hidden: list[str] = ["embeddings"]
    attentions: list[str] = ["layer 0"]
    token = collector.context_var.set({"hidden_states": hidden, "attentions": attentions})

    def block(tag: str) -> str:
        outputs = collector.global_var
        assert outputs["hidden_states"] is hidden  # shared: its hook numbers layers by length
        assert outputs["attentions"] == [] and outputs["attentions"] is not attentions
        outputs["attentions"].append(tag)
        return tag

    try:
        assert hf.call_collecting_per_block(collector, block, "layer 1") == "layer 1"
    finally:
        collector.context_var.reset(token)
    assert attentions == ["layer 0", "layer 1"] and hidden == ["embeddings"]
    assert not collector.compiling and collector.global_var is None


def test_a_block_call_under_an_outer_compile_is_left_alone() -> None:
    collector = hf.active_collector()
    collector.global_var, collector.compiling = {"x": []}, True  # what transformers sets traced
    try:
        assert hf.call_collecting_per_block(collector, lambda: collector.global_var) == {"x": []}
        assert collector.compiling
    finally:
        collector.global_var, collector.compiling = None, False


def test_a_model_call_collects_through_the_context_var(model) -> None:  # type: ignore[no-untyped-def]
    import torch

    out = model(torch.ones(1, 3, dtype=torch.long), output_hidden_states=True)
    assert len(out.hidden_states) == 2  # embeddings and the one layer, through the collector


def test_guards_can_record_registry(model) -> None:  # type: ignore[no-untyped-def]
    """A whole-model trace of a transformers model guards on the registry's entries."""
    import torch

    from torchkiln._internals.versions import feature_problem

    if feature_problem("tiered compilation") is not None:
        # Only the whole-model tier (torch 2.13 and later) filters this guard; torch 2.11's
        # Dynamo cannot even build a whole-model LlamaModel's guards with transformers 5.25
        # ("Guarded object must be identical" on its per-layer config view).
        pytest.skip("the whole-model tier needs torch 2.13; torch 2.11 cannot trace it whole")

    names: list[str] = []

    def record(entries: list) -> list[bool]:  # type: ignore[type-arg]
        names.extend(entry.name for entry in entries)
        return [True] * len(entries)

    torch._dynamo.reset()
    try:
        compiled = torch.compile(
            model, backend="eager", fullgraph=True, options={"guard_filter_fn": record}
        )
        compiled(torch.ones(1, 3, dtype=torch.long), output_hidden_states=True)
    finally:
        torch._dynamo.reset()
    assert any(hf.guards_can_record_registry(name) for name in names), names[:20]
    assert not hf.guards_can_record_registry("module._modules['layers']")
