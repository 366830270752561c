"""Contracts of ``torchkiln._internals.hub_kernels``: Hugging Face ``kernels``' function modules
(transformers 5.25 depends on ``kernels``) as the installed releases make them."""

from __future__ import annotations

import pickle
import sys

import pytest
import torch

from torchkiln._internals import hub_kernels

kernels = pytest.importorskip("kernels")
pytest.importorskip("transformers")


@kernels.use_kernel_forward_from_hub("TorchkilnTestDoubled")
def doubled(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def tripled(x: torch.Tensor) -> torch.Tensor:
    return x * 3


def test_kernels_makes_a_function_module_of_a_class_pickle_cannot_find() -> None:
    """What the adapter relies on: the class's qualified name is kernels' local one (until the
    adapter names it), and the instance is pickled by its function's name."""
    kind = type(doubled)
    assert isinstance(doubled, torch.nn.Module)
    assert kind.__module__ == __name__
    assert kind.__qualname__ in (hub_kernels.LOCAL_FUNC_CLASS, "doubled.__class__")
    assert pickle.loads(pickle.dumps(doubled)) is doubled


def test_name_function_modules_lets_pickle_find_the_class() -> None:
    named = hub_kernels.name_function_modules([__name__, "no.such.module"])
    kind = type(doubled)
    assert kind.__name__ == kind.__qualname__ == "doubled.__class__"
    assert named in ([f"{__name__}.doubled"], [])  # [] where an earlier call named it
    assert pickle.loads(pickle.dumps(kind)) is kind
    assert hub_kernels.name_function_modules([__name__]) == []  # idempotent
    assert torch.equal(doubled(torch.ones(2)), torch.full((2,), 2.0))


def test_name_function_modules_skips_a_global_that_is_not_the_class_home() -> None:
    """Another module's alias of the instance under another name: pickle could not resolve the
    class through it, so it is not used."""
    alias = type(sys)("torchkiln_test_alias")
    alias.other_name = kernels.use_kernel_forward_from_hub("TorchkilnTestAlias")(tripled)
    sys.modules[alias.__name__] = alias
    try:
        assert hub_kernels.name_function_modules([alias.__name__]) == []
        assert type(alias.other_name).__qualname__ == hub_kernels.LOCAL_FUNC_CLASS
    finally:
        del sys.modules[alias.__name__]


def test_unrouted_forward_of_transformers_attention_computes_the_same() -> None:
    from torchkiln.examples import llama

    model = llama(depth=1, hidden_size=16, heads=2, kv_heads=2, intermediate_size=32)
    attention = model.model.layers[0].self_attn
    forward = hub_kernels.unrouted_forward(attention)
    assert forward is not None, "transformers' attention is no longer wrapped by kernels"
    hidden = torch.randn(1, 4, 16)
    embeddings = model.model.rotary_emb(hidden, torch.arange(4)[None])
    with torch.no_grad():
        expected = attention(hidden, position_embeddings=embeddings, attention_mask=None)[0]
        actual = forward(hidden, position_embeddings=embeddings, attention_mask=None)[0]
    assert torch.equal(actual, expected)
    assert hub_kernels.unrouted_forward(model.model.layers[0].mlp) is None  # not wrapped
    [wrapper] = vars(attention)["_kernel_funcs"].values()
    wrapper.forward = lambda *args, **kwargs: None  # what kernelize installs: routing matters
    assert hub_kernels.unrouted_forward(attention) is None
