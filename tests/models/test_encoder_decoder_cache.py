"""The transformers adapter on encoder-decoders (BART, Whisper) with their default
``EncoderDecoderCache``: each decoder layer gets its own layer's view of both halves and of
``is_updated``, so the graph count does not grow with depth, even past Dynamo's recompile
limit (8), and the results equal eager."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from decoder_zoo import eager_regions
from torch._dynamo.utils import counters

import torchkiln
from torchkiln.plugin import PartialCompileWarning

pytest.importorskip("transformers")

SIZES = {
    "d_model": 32,
    "encoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
}


@pytest.fixture(autouse=True)
def fresh_dynamo(reset_dynamo: None, torchkiln_clean_environment: None) -> Iterator[None]:
    yield


def bart(depth: int) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(0)
    config = BartConfig(vocab_size=128, decoder_layers=depth, **SIZES)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 128, (2, 10), generator=generator)
    return BartForConditionalGeneration(config).eval(), {"input_ids": ids}


def whisper(depth: int) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(0)
    config = WhisperConfig(
        decoder_layers=depth,
        max_source_positions=16,
        max_target_positions=32,
        num_mel_bins=16,
        **SIZES,
    )
    generator = torch.Generator().manual_seed(1)
    features = torch.randn(2, 16, 32, generator=generator)
    return WhisperForConditionalGeneration(config).eval(), {"input_features": features}


def t5(depth: int) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    # num_layers for both stacks: transformers 5.x sizes T5's default cache by num_layers, so
    # a different num_decoder_layers fails eagerly (IndexError in DynamicCache.update).
    sizes = {"d_model": 32, "d_kv": 8, "d_ff": 64, "num_heads": 4}
    config = T5Config(vocab_size=128, num_layers=depth, decoder_start_token_id=0, **sizes)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 128, (2, 10), generator=generator)
    return T5ForConditionalGeneration(config).eval(), {"input_ids": ids}


MODELS: dict[str, Callable[[int], tuple[torch.nn.Module, dict[str, torch.Tensor]]]] = {
    "bart": bart,
    "whisper": whisper,
    "t5": t5,
}
MAX_GRAPHS = {"bart": 5, "whisper": 5, "t5": 7}
"""BART, Whisper: the encoder layer 2 (the plain forward and generate() pass different
keywords), the decoder layer 3 (prefill computes the cross-attention keys, decode reuses
them; the first decode step's cache length 1 is specialised, later ones are dynamic). T5: one
block class for both stacks, block 0 (relative position bias) its own group."""


def logits_and_tokens(model: torch.nn.Module, inputs: dict[str, Any]) -> list[torch.Tensor]:
    """One forward (logits, cache filled) and a greedy 8-token ``generate()``."""
    start = torch.full((2, 1), model.generation_config.decoder_start_token_id)
    with torch.no_grad():
        logits = model(**inputs, decoder_input_ids=start).logits
        ids = model.generate(**inputs, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    return [logits, ids]


def graphs_at(name: str, depth: int) -> int:
    model, inputs = MODELS[name](depth)
    compiled = copy.deepcopy(model)
    expected = logits_and_tokens(model, inputs)
    counters.clear()
    torchkiln.compile(compiled, backend="eager")
    actual = logits_and_tokens(compiled, inputs)
    torch.testing.assert_close(actual[0], expected[0], atol=1e-5, rtol=1e-4)
    assert torch.equal(actual[1], expected[1]), (actual[1], expected[1])
    assert actual[1].shape[1] >= 8
    assert eager_regions(compiled) == (), eager_regions(compiled)
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    return int(counters["stats"]["unique_graphs"])


@pytest.mark.parametrize("name", list(MODELS))
def test_decoder_layers_share_graphs_past_the_recompile_limit(name: str) -> None:
    graphs = {depth: graphs_at(name, depth) for depth in (10, 12)}
    assert graphs[10] == graphs[12], graphs
    assert graphs[12] <= MAX_GRAPHS[name], graphs


def test_is_updated_is_written_back_per_layer() -> None:
    """After a compiled forward, the whole cache's ``is_updated`` says every decoder layer
    stored its cross-attention keys (the flag the view keeps is copied back)."""
    model, inputs = bart(3)
    torchkiln.compile(model, backend="eager")
    start = torch.full((2, 1), model.config.decoder_start_token_id)
    with torch.no_grad():
        cache = model(**inputs, decoder_input_ids=start, use_cache=True).past_key_values
    assert type(cache).__name__ == "EncoderDecoderCache"
    assert cache.is_updated == {0: True, 1: True, 2: True}
    assert [layer.keys.shape[2] for layer in cache.cross_attention_cache.layers] == [10] * 3
    assert [layer.keys.shape[2] for layer in cache.self_attention_cache.layers] == [1] * 3


def test_a_half_that_cannot_be_split_passes_the_cache_through_visibly(
    recwarn: pytest.WarningsRecorder,
) -> None:
    """A self-attention cache that overrides ``update``: the whole ``EncoderDecoderCache`` is
    passed through as without the adapter (results equal to eager), and stderr says so."""
    from transformers import DynamicCache, EncoderDecoderCache

    class LoggingCache(DynamicCache):
        def update(self, key_states, value_states, layer_idx, *args, **kwargs):  # type: ignore[no-untyped-def]
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    model, inputs = bart(3)
    compiled = copy.deepcopy(model)
    start = torch.full((2, 1), model.config.decoder_start_token_id)

    def logits(model: torch.nn.Module) -> torch.Tensor:
        cache = EncoderDecoderCache(LoggingCache(), DynamicCache())
        with torch.no_grad():
            return model(**inputs, decoder_input_ids=start, cache=cache).logits

    expected = logits(model)
    torchkiln.compile(compiled, backend="eager")
    torch.testing.assert_close(logits(compiled), expected)
    err = "\n".join(str(w.message) for w in recwarn if w.category is PartialCompileWarning)
    assert "group 'BartDecoderLayer': EncoderDecoderCache holds a cache that cannot be split" in err
    assert "LoggingCache overrides Cache.update" in err
    assert "passed through whole" in err
