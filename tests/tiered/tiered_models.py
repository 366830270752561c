"""The model the tiered tests compile."""

import torch

from torchkiln.examples import llama


def tiny_llama(depth: int = 2) -> torch.nn.Module:
    """A default-config Llama at tiny sizes (KV cache, default attention: nothing switched off)."""
    return llama(
        depth=depth, hidden_size=64, intermediate_size=128, heads=4, kv_heads=2, vocab_size=256
    )
