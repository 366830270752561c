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
