"""Built-in example models, built from configs with random weights (never downloaded).

``torchkiln plan``, ``torchkiln bench`` and the tests use them. ``transformers`` is imported
only when a transformers-based example is built.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from torchkiln.errors import TorchkilnError

DEFAULT_DEPTH = 16


def llama(
    depth: int = DEFAULT_DEPTH,
    hidden_size: int = 256,
    heads: int = 8,
    kv_heads: int = 4,
    intermediate_size: int = 688,
    vocab_size: int = 4096,
) -> nn.Module:
    """A small Llama-family causal LM (``LlamaForCausalLM``) at ``depth`` decoder layers.

    Built as users get it: the default config (KV cache on, default attention) with only the
    sizes changed, random weights.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=depth,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=vocab_size,
        max_position_embeddings=1024,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """New floating-point tensors in ``dtype`` while building (as transformers does for
    ``from_config(dtype=...)``); buffers that ask for float32 explicitly keep it."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def llama_1b(
    depth: int = DEFAULT_DEPTH,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = torch.float32,
) -> nn.Module:
    """A Llama-3.2-1B-sized causal LM (``LlamaForCausalLM``, random weights) at ``depth``
    decoder layers: hidden 2048, intermediate 8192, 32 heads, 8 KV heads, vocabulary 128256,
    input and output embeddings tied as in Llama-3.2-1B; the default config otherwise (KV
    cache on, default attention and RoPE). About 1.24e9 parameters at depth 16, 2.21e9 at 32.

    Built directly on ``device`` in ``dtype`` (no float32 copy on the CPU first);
    ``device="meta"`` gives the shapes without memory (parameter counts).
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=depth,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        tie_word_embeddings=True,
    )
    torch_dtype: torch.dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    torch.manual_seed(0)
    with torch.device(device), _default_dtype(torch_dtype):
        return LlamaForCausalLM(config).eval()


def gpt2(
    depth: int = 4, hidden_size: int = 128, heads: int = 4, vocab_size: int = 1024
) -> nn.Module:
    """A small GPT-2 (``GPT2LMHeadModel``) at ``depth`` blocks (default config, sizes changed)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=depth,
        n_embd=hidden_size,
        n_head=heads,
        vocab_size=vocab_size,
        n_positions=512,
    )
    torch.manual_seed(0)
    return GPT2LMHeadModel(config).eval()


class ToyTransformer(nn.Module):
    """Pure-PyTorch stack of ``nn.TransformerEncoderLayer`` blocks (no transformers needed)."""

    def __init__(self, depth: int = 4, width: int = 64, heads: int = 4, vocab_size: int = 512):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, width)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                width, heads, dim_feedforward=2 * width, dropout=0.0, batch_first=True
            )
            for _ in range(depth)
        )
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(input_ids)
        for layer in self.layers:
            hidden = layer(hidden)
        return self.head(self.norm(hidden))


def toy(depth: int = 4) -> nn.Module:
    """:class:`ToyTransformer` at ``depth`` blocks."""
    torch.manual_seed(0)
    return ToyTransformer(depth).eval()


EXAMPLES: dict[str, Callable[..., nn.Module]] = {
    "llama": llama,
    "llama-1b": llama_1b,
    "gpt2": gpt2,
    "toy": toy,
}
BUILDS_ON_DEVICE = frozenset({"llama-1b"})
"""Examples whose factory takes ``device`` and ``dtype`` and builds there directly."""


def example_inputs(model: nn.Module, batch: int = 1, seq: int = 128) -> torch.Tensor:
    """Token ids that fit ``model``'s vocabulary."""
    config = getattr(model, "config", None)
    vocab = getattr(config, "vocab_size", None)
    if vocab is None:
        embedding = next(m for m in model.modules() if isinstance(m, nn.Embedding))
        vocab = embedding.num_embeddings
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, vocab, (batch, seq), generator=generator)


def load_model(spec: str, **kwargs: Any) -> nn.Module:
    """Build a model from ``NAME``, ``NAME:DEPTH`` (a built-in example) or
    ``package.module:factory`` (called with ``kwargs``)."""
    name, _, arg = spec.partition(":")
    if name in EXAMPLES:
        if arg:
            if not arg.isdigit():
                raise TorchkilnError(f"model {spec!r}: the depth after ':' must be a whole number")
            kwargs.setdefault("depth", int(arg))
        return EXAMPLES[name](**kwargs)
    if not arg:
        raise TorchkilnError(
            f"model {spec!r} is neither a built-in example ({', '.join(sorted(EXAMPLES))}, "
            "optionally NAME:DEPTH) nor 'package.module:factory'"
        )
    try:
        module = importlib.import_module(name)
    except ImportError as error:
        raise TorchkilnError(f"model {spec!r}: cannot import {name!r}: {error}") from error
    factory = getattr(module, arg, None)
    if not callable(factory):
        raise TorchkilnError(f"model {spec!r}: {name!r} has no callable {arg!r}")
    model = factory(**kwargs)
    if not isinstance(model, nn.Module):
        raise TorchkilnError(
            f"model {spec!r}: {arg}() returned {type(model).__name__}, not nn.Module"
        )
    return model
