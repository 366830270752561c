"""Built-in example models, built from configs with random weights (never downloaded).

``torchkiln plan``, ``torchkiln bench`` and the tests use them. ``transformers`` is imported
only when a transformers-based example is built.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import torch
from torch import nn

from torchkiln.errors import TorchkilnError

DEFAULT_DEPTH = 16
MAX_DEPTH = 1024
"""Deeper built-in examples are refused before anything is built (the deepest released
transformer has ~130 blocks)."""
MAX_TOKENS = 2**24
"""``batch x seq`` above this is refused before the example inputs are allocated."""
CHECK_MEMORY_ABOVE = 128
"""Built-in examples deeper than this are first sized on the meta device (a few seconds for
the large ones) and refused when their weights exceed the machine's memory."""
MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
FACTORY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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
    return _llama_lm(
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=depth,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=vocab_size,
        max_position_embeddings=1024,
    )


def _llama_lm(**config: Any) -> nn.Module:
    """``LlamaForCausalLM`` of the default ``LlamaConfig`` with ``config`` changed, seeded."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**config)).eval()


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
    cache on, default attention and RoPE).

    Built directly on ``device`` in ``dtype`` (no float32 copy on the CPU first);
    ``device="meta"`` gives the shapes without memory (parameter counts).
    """
    torch_dtype: torch.dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    with torch.device(device), _default_dtype(torch_dtype):
        return _llama_lm(
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=depth,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=128256,
            tie_word_embeddings=True,
        )


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


def check_tokens(batch: int, seq: int, model: nn.Module | None = None) -> None:
    """Refuse ``batch x seq`` token inputs that cannot be built, before allocating them: each
    at least 1, at most :data:`MAX_TOKENS` together, ``seq`` within the model's positions."""
    if batch < 1 or seq < 1:
        raise TorchkilnError(f"--batch {batch} --seq {seq}: both must be >= 1")
    if batch * seq > MAX_TOKENS:
        raise TorchkilnError(
            f"--batch {batch} --seq {seq}: {batch * seq} tokens; at most {MAX_TOKENS} per call"
        )
    config = getattr(model, "config", None)
    positions = getattr(config, "max_position_embeddings", None) or getattr(
        config, "n_positions", None
    )
    if isinstance(positions, int) and seq > positions:
        raise TorchkilnError(f"--seq {seq}: this model takes at most {positions} positions")


def _check_depth(spec: str, depth: Any) -> None:
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= MAX_DEPTH:
        raise TorchkilnError(
            f"model {spec!r}: depth {depth!r} must be a whole number from 1 to {MAX_DEPTH}"
        )


def _parameter_bytes(factory: Callable[..., nn.Module], kwargs: dict[str, Any]) -> int:
    if "device" in kwargs:  # an example that builds on its device: build on meta instead
        kwargs = {**kwargs, "device": "meta"}
    with torch.device("meta"):
        model = factory(**kwargs)
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def _check_memory(spec: str, name: str, kwargs: dict[str, Any]) -> None:
    """Refuse a built-in example whose weights cannot fit in this machine's memory, estimated
    on the meta device from depths 1 and 2 (nothing is allocated)."""
    factory = EXAMPLES[name]
    depth = kwargs["depth"]
    one = _parameter_bytes(factory, {**kwargs, "depth": 1})
    two = _parameter_bytes(factory, {**kwargs, "depth": 2})
    needed = one + (depth - 1) * (two - one)
    available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if needed > available:
        raise TorchkilnError(
            f"model {spec!r}: its weights need about {needed / 2**30:.1f} GiB, more than this "
            f"machine's {available / 2**30:.1f} GiB; choose a smaller depth"
        )


@contextlib.contextmanager
def _working_directory_last() -> Iterator[None]:
    """The working directory searched for imports after every installed package, and only
    inside this block: a user's own ``module:factory`` is found there, while a planted
    ``sympy.py`` never shadows the real one."""
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.append(cwd)
    try:
        yield
    finally:
        if added:
            with contextlib.suppress(ValueError):
                sys.path.remove(cwd)


def _import_spec(spec: str, name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as error:
        raise TorchkilnError(f"model {spec!r}: cannot import {name!r}: {error}") from error
    except Exception as error:  # the module itself failed while importing
        raise TorchkilnError(
            f"model {spec!r}: importing {name!r} raised {type(error).__name__}: {error}"
        ) from error


def load_model(spec: str, **kwargs: Any) -> nn.Module:
    """Build a model from ``NAME``, ``NAME:DEPTH`` (a built-in example) or
    ``package.module:factory`` (called with ``kwargs``). A ``package.module`` is searched in
    the installed packages, then in the working directory.

    :raises TorchkilnError: a spec that names nothing importable, a depth out of range or too
        large for this machine's memory, a factory that raises or returns no module.
    """
    name, _, arg = spec.partition(":")
    if name in EXAMPLES:
        if arg:
            if not arg.isdigit():
                raise TorchkilnError(f"model {spec!r}: the depth after ':' must be a whole number")
            kwargs.setdefault("depth", int(arg))
        if "depth" in kwargs:
            _check_depth(spec, kwargs["depth"])
            if kwargs["depth"] > CHECK_MEMORY_ABOVE:
                _check_memory(spec, name, kwargs)
        return EXAMPLES[name](**kwargs)
    if not arg or not MODULE_NAME.fullmatch(name) or not FACTORY_NAME.fullmatch(arg):
        raise TorchkilnError(
            f"model {spec!r} is neither a built-in example ({', '.join(sorted(EXAMPLES))}, "
            "optionally NAME:DEPTH) nor 'package.module:factory' (dotted Python names)"
        )
    with _working_directory_last():
        module = _import_spec(spec, name)
        factory = getattr(module, arg, None)
        if not callable(factory):
            raise TorchkilnError(f"model {spec!r}: {name!r} has no callable {arg!r}")
        try:
            model = factory(**kwargs)
        except Exception as error:
            raise TorchkilnError(
                f"model {spec!r}: {arg}() raised {type(error).__name__}: {error}"
            ) from error
    if not isinstance(model, nn.Module):
        raise TorchkilnError(
            f"model {spec!r}: {arg}() returned {type(model).__name__}, not nn.Module"
        )
    return model
