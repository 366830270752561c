"""Models and counters shared by the Accelerate compatibility tests."""

from __future__ import annotations

import pytest
import torch


def compiled_graphs() -> int:
    """Graphs Dynamo compiled since the last reset."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def gpt2_model() -> torch.nn.Module:
    pytest.importorskip("transformers", reason="the GPT-2 example needs transformers")
    from torchkiln.examples import gpt2

    return gpt2(depth=2)


def llama_model() -> torch.nn.Module:
    pytest.importorskip("transformers", reason="the Llama example needs transformers")
    from torchkiln.examples import llama

    return llama(
        depth=2, hidden_size=64, heads=4, kv_heads=2, intermediate_size=128, vocab_size=256
    )


def token_ids(vocab: int = 256, batch: int = 2, seq: int = 8) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab, (batch, seq), generator=generator)


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits
