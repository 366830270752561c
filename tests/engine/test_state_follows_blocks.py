"""Compiled state follows the blocks: ``is_compiled``, ``report`` and ``decompile`` work on any
object that holds torchkiln-compiled blocks, not only the module ``compile`` was given."""

from __future__ import annotations

import pytest
import torch
from stack_model import Stack
from torch import nn

import torchkiln


def compiled_stack() -> Stack:
    model = torchkiln.compile(Stack(), backend="eager", progress="off")
    with torch.no_grad():
        model(torch.randn(2, 8))
    return model


def instance_forwards(module: nn.Module) -> list[str]:
    return [name for name, m in module.named_modules() if "forward" in m.__dict__]


class Rewrapped(nn.Module):
    """What another library does: a new module around the compiled one."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def test_a_rewrapped_model_is_compiled_reported_and_decompiled() -> None:
    model = compiled_stack()
    wrapper = Rewrapped(model)
    assert torchkiln.is_compiled(wrapper)
    assert len(torchkiln.report(wrapper).regions) == len(torchkiln.report(model).regions)
    assert torchkiln.decompile(wrapper) is wrapper
    assert instance_forwards(wrapper) == []
    assert not torchkiln.is_compiled(model)  # the whole compile was undone, at its root too


def test_a_submodule_taken_out_is_decompiled_alone() -> None:
    model = compiled_stack()
    blocks = list(model.blocks)
    taken = blocks[0]
    assert torchkiln.is_compiled(taken)
    [region] = torchkiln.report(taken).regions
    assert region.status == "compiled"
    torchkiln.decompile(taken)
    assert "forward" not in taken.__dict__
    assert not torchkiln.is_compiled(taken)
    # The rest stays compiled and reported, without the block that left.
    assert torchkiln.is_compiled(model)
    assert len(torchkiln.report(model).regions) == len(blocks) - 1


def test_an_object_holding_nothing_compiled_says_so() -> None:
    with pytest.raises(torchkiln.TorchkilnError, match="holds no block torchkiln compiled"):
        torchkiln.report(Stack())
    assert not torchkiln.is_compiled(Stack())


@pytest.mark.slow  # CI's sample of the family zoo (docs/zoo.md)
def test_peft_merge_and_unload_keeps_the_compiled_state_with_the_blocks() -> None:
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128,
    )  # fmt: skip
    torch.manual_seed(0)
    base = transformers.LlamaForCausalLM(config).eval()
    lora = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = peft.get_peft_model(base, lora)
    torchkiln.compile(model, backend="eager", progress="off")
    ids = torch.randint(0, 128, (1, 6))
    with torch.no_grad():
        expected = model(ids).logits
        merged = model.merge_and_unload()
        assert torchkiln.is_compiled(merged)
        torch.testing.assert_close(merged(ids).logits, expected, rtol=1e-4, atol=1e-4)
    report = torchkiln.report(merged)
    assert len(report.regions) == config.num_hidden_layers
    assert all(r.status == "compiled" for r in report.regions)
    torchkiln.decompile(merged)
    assert instance_forwards(merged) == []
    assert not torchkiln.is_compiled(merged) and not torchkiln.is_compiled(model)
