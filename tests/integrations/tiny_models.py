"""``LlamaForCausalLM`` from its default config (only the sizes changed), and a weight checksum."""

from __future__ import annotations

import pytest
import torch

VOCAB = 256


def tiny_llama(seed: int = 0) -> torch.nn.Module:
    pytest.importorskip("transformers", reason="tiny_llama is a transformers model")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
    )
    return LlamaForCausalLM(config)


def weight_sum(module: torch.nn.Module) -> float:
    return float(sum(p.detach().double().sum() for p in module.parameters()))
