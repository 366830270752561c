"""Thirty-odd transformers architectures, built tiny from their default configs.

Only sizes change (hidden sizes, layer counts, heads, vocabularies, image and audio lengths);
every feature keeps its default (dropout, drop-path rates, ``use_cache``...). Convnets keep
their default depths (``ResNetConfig()`` is the ResNet-50 layout: 3, 4, 6, 3 bottlenecks) and
shrink widths only. Each case says which block classes the plan must choose.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import torch
from torch import nn

VOCAB = 96
SEQ = 8
IMAGE = 32
AUDIO = 1600


@attrs.frozen
class ZooCase:
    name: str
    family: str
    build: Callable[[], nn.Module]
    inputs: Callable[[nn.Module], dict[str, Any]]
    level: frozenset[str]
    """Classes the plan must choose: the set of its groups' classes (empty: the whole model)."""
    blocks: frozenset[str] = frozenset()
    """The model's block classes (its layers); their distinct shapes + 1 bound the graph
    count. Empty: the level's classes."""
    cached: bool = False
    """An encoder-decoder whose decoder blocks use an ``EncoderDecoderCache`` (default
    ``use_cache``): the transformers adapter hands each decoder layer its own layer's view of
    it (both halves and ``is_updated``), so the graph bound holds as for any other model."""


def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def token_inputs(model: nn.Module) -> dict[str, Any]:
    return {"input_ids": torch.randint(0, VOCAB, (2, SEQ), generator=_generator())}


def seq2seq_inputs(model: nn.Module) -> dict[str, Any]:
    ids = torch.randint(3, VOCAB, (2, SEQ), generator=_generator())
    return {"input_ids": ids, "decoder_input_ids": ids[:, : SEQ // 2]}


def image_inputs(model: nn.Module) -> dict[str, Any]:
    channels = getattr(model.config, "num_channels", 3)
    size = getattr(model.config, "image_size", IMAGE)
    size = size[0] if isinstance(size, list | tuple) else size
    return {"pixel_values": torch.randn(2, channels, size, size, generator=_generator())}


def audio_inputs(model: nn.Module) -> dict[str, Any]:
    return {"input_values": torch.randn(2, AUDIO, generator=_generator())}


def whisper_inputs(model: nn.Module) -> dict[str, Any]:
    config = model.config
    frames = 2 * config.max_source_positions
    features = torch.randn(2, config.num_mel_bins, frames, generator=_generator())
    ids = torch.randint(3, VOCAB, (2, 4), generator=_generator())
    return {"input_features": features, "decoder_input_ids": ids}


def _build(config_name: str, model_name: str, **sizes: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import transformers

        config = getattr(transformers, config_name)(**sizes)
        return getattr(transformers, model_name)(config).eval()

    return build


TEXT = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "intermediate_size": 64,
}
DECODER = TEXT | {"num_key_value_heads": 2}
VISION = {
    "hidden_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "image_size": IMAGE,
    "patch_size": 8,
}


def _case(
    name: str,
    family: str,
    build: Callable[[], nn.Module],
    inputs: Any,
    *level: str,
    blocks: tuple[str, ...] = (),
    cached: bool = False,
) -> ZooCase:
    return ZooCase(
        name, family, build, inputs, frozenset(level), frozenset(blocks or level), cached
    )


CASES: tuple[ZooCase, ...] = (
    # --- decoders ---
    _case(
        "llama",
        "decoder",
        _build("LlamaConfig", "LlamaForCausalLM", **DECODER),
        token_inputs,
        "LlamaDecoderLayer",
    ),
    _case(
        "mistral",
        "decoder",
        _build("MistralConfig", "MistralForCausalLM", **DECODER),
        token_inputs,
        "MistralDecoderLayer",
    ),
    _case(
        "qwen2",
        "decoder",
        _build("Qwen2Config", "Qwen2ForCausalLM", **DECODER),
        token_inputs,
        "Qwen2DecoderLayer",
    ),
    _case(
        "gemma2",
        "decoder",
        _build(
            "Gemma2Config", "Gemma2ForCausalLM", **(DECODER | {"num_hidden_layers": 4}), head_dim=8
        ),
        token_inputs,
        "Gemma2DecoderLayer",
    ),
    _case(
        "gpt2",
        "decoder",
        _build("GPT2Config", "GPT2LMHeadModel", vocab_size=VOCAB, n_embd=32, n_layer=3, n_head=4),
        token_inputs,
        "GPT2Block",
    ),
    _case(
        "opt",
        "decoder",
        _build(
            "OPTConfig",
            "OPTForCausalLM",
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=3,
            num_attention_heads=4,
            ffn_dim=64,
            word_embed_proj_dim=32,
        ),
        token_inputs,
        "OPTDecoderLayer",
    ),
    _case(
        "gpt_neox",
        "decoder",
        _build("GPTNeoXConfig", "GPTNeoXForCausalLM", **TEXT),
        token_inputs,
        "GPTNeoXLayer",
    ),
    # --- encoders ---
    _case("bert", "encoder", _build("BertConfig", "BertModel", **TEXT), token_inputs, "BertLayer"),
    _case(
        "roberta",
        "encoder",
        _build("RobertaConfig", "RobertaModel", **TEXT),
        token_inputs,
        "RobertaLayer",
    ),
    # ModernBERT: layer 0 has no attention norm, and every third layer attends globally (0, 3):
    # layer 3 is a shape of its own, whose attention and MLP repeat layer 0's.
    _case(
        "modernbert",
        "encoder",
        _build(
            "ModernBertConfig",
            "ModernBertModel",
            **(TEXT | {"num_hidden_layers": 6, "vocab_size": 50368}),
        ),
        token_inputs,
        "ModernBertEncoderLayer",
        "ModernBertAttention",
        "ModernBertMLP",
        blocks=("ModernBertEncoderLayer",),
    ),
    _case(
        "distilbert",
        "encoder",
        _build(
            "DistilBertConfig",
            "DistilBertModel",
            vocab_size=VOCAB,
            dim=32,
            n_layers=3,
            n_heads=4,
            hidden_dim=64,
        ),
        token_inputs,
        "TransformerBlock",
    ),
    _case(
        "electra",
        "encoder",
        _build("ElectraConfig", "ElectraModel", **(TEXT | {"embedding_size": 16})),
        token_inputs,
        "ElectraLayer",
    ),
    _case(
        "albert",
        "encoder",
        _build("AlbertConfig", "AlbertModel", **(TEXT | {"embedding_size": 16})),
        token_inputs,
        blocks=("AlbertLayer",),
    ),
    # --- encoder-decoders ---
    _case(
        "t5",
        "encoder-decoder",
        _build(
            "T5Config",
            "T5ForConditionalGeneration",
            vocab_size=VOCAB,
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=3,
            num_heads=4,
        ),
        seq2seq_inputs,
        "T5Block",
        "T5LayerFF",
        cached=True,
        blocks=("T5Block",),
    ),
    _case(
        "bart",
        "encoder-decoder",
        _build(
            "BartConfig",
            "BartForConditionalGeneration",
            vocab_size=VOCAB,
            d_model=32,
            encoder_layers=3,
            decoder_layers=3,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
        ),
        seq2seq_inputs,
        "BartEncoderLayer",
        "BartDecoderLayer",
        cached=True,
    ),
    _case(
        "pegasus",
        "encoder-decoder",
        _build(
            "PegasusConfig",
            "PegasusForConditionalGeneration",
            vocab_size=VOCAB,
            d_model=32,
            encoder_layers=3,
            decoder_layers=3,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
        ),
        seq2seq_inputs,
        "PegasusEncoderLayer",
        "PegasusDecoderLayer",
        cached=True,
    ),
    # --- vision transformers ---
    _case("vit", "vision", _build("ViTConfig", "ViTModel", **VISION), image_inputs, "ViTLayer"),
    _case("deit", "vision", _build("DeiTConfig", "DeiTModel", **VISION), image_inputs, "DeiTLayer"),
    _case(
        "dinov2",
        "vision",
        _build("Dinov2Config", "Dinov2Model", **VISION),
        image_inputs,
        "Dinov2Layer",
    ),
    _case(
        "siglip",
        "vision",
        _build("SiglipVisionConfig", "SiglipVisionModel", **VISION),
        image_inputs,
        "SiglipEncoderLayer",
    ),
    _case(
        "clip",
        "vision",
        _build("CLIPVisionConfig", "CLIPVisionModel", **VISION),
        image_inputs,
        "CLIPEncoderLayer",
    ),
    # BEiT's default drop_path_rate gives each layer its own drop_prob (a float Dynamo
    # specialises on): no two BeitLayers are alike, their attention and MLP parts are.
    _case(
        "beit",
        "vision",
        _build("BeitConfig", "BeitModel", **VISION),
        image_inputs,
        "BeitAttention",
        "BeitMLP",
        blocks=("BeitLayer",),
    ),
    # Swin: widths double per stage and each layer has its own drop_prob; shifted and
    # unshifted layers alternate. The attention and MLP parts repeat within a stage.
    _case(
        "swin",
        "vision",
        _build("SwinConfig", "SwinModel", embed_dim=24),
        image_inputs,
        "SwinAttention",
        "SwinMLP",
        blocks=("SwinLayer",),
    ),
    # --- convnets (default depths, small widths) ---
    _case(
        "resnet",
        "convnet",
        _build("ResNetConfig", "ResNetModel", embedding_size=8, hidden_sizes=[16, 32, 64, 128]),
        image_inputs,
        "ResNetBottleNeckLayer",
    ),
    _case(
        "convnext",
        "convnet",
        _build(
            "ConvNextConfig", "ConvNextModel", hidden_sizes=[8, 16, 32, 64], image_size=2 * IMAGE
        ),
        image_inputs,
        "ConvNextLayer",
    ),
    _case(
        "convnextv2",
        "convnet",
        _build(
            "ConvNextV2Config",
            "ConvNextV2Model",
            hidden_sizes=[8, 16, 32, 64],
            image_size=2 * IMAGE,
        ),
        image_inputs,
        "ConvNextV2Layer",
    ),
    _case(
        "regnet",
        "convnet",
        _build(
            "RegNetConfig",
            "RegNetModel",
            embedding_size=8,
            hidden_sizes=[8, 16, 32, 64],
            groups_width=8,
        ),
        image_inputs,
        "RegNetYLayer",
        "RegNetConvLayer",
        "RegNetSELayer",
        blocks=("RegNetYLayer",),
    ),
    _case(
        "segformer",
        "convnet",
        _build(
            "SegformerConfig",
            "SegformerModel",
            hidden_sizes=[8, 16, 32, 64],
            num_attention_heads=[1, 2, 4, 8],
            decoder_hidden_size=32,
            image_size=IMAGE,
        ),
        image_inputs,
        "SegformerAttention",
        "SegformerMixMLP",
        blocks=("SegformerLayer",),
    ),
    # --- audio ---
    _case(
        "wav2vec2",
        "audio",
        _build(
            "Wav2Vec2Config",
            "Wav2Vec2Model",
            **(
                TEXT
                | {
                    "conv_dim": [16] * 7,
                    "num_conv_pos_embeddings": 16,
                    "num_conv_pos_embedding_groups": 4,
                }
            ),
        ),
        audio_inputs,
        "Wav2Vec2EncoderLayer",
        "Wav2Vec2NoLayerNormConvLayer",
        blocks=(
            "Wav2Vec2EncoderLayer",
            "Wav2Vec2NoLayerNormConvLayer",
            "Wav2Vec2GroupNormConvLayer",
        ),
    ),
    _case(
        "hubert",
        "audio",
        _build(
            "HubertConfig",
            "HubertModel",
            **(
                TEXT
                | {
                    "conv_dim": [16] * 7,
                    "num_conv_pos_embeddings": 16,
                    "num_conv_pos_embedding_groups": 4,
                }
            ),
        ),
        audio_inputs,
        "HubertEncoderLayer",
        "HubertNoLayerNormConvLayer",
        blocks=("HubertEncoderLayer", "HubertNoLayerNormConvLayer", "HubertGroupNormConvLayer"),
    ),
    _case(
        "wavlm",
        "audio",
        _build(
            "WavLMConfig",
            "WavLMModel",
            **(
                TEXT
                | {
                    "conv_dim": [16] * 7,
                    "num_conv_pos_embeddings": 16,
                    "num_conv_pos_embedding_groups": 4,
                }
            ),
        ),
        audio_inputs,
        "WavLMEncoderLayer",
        "WavLMNoLayerNormConvLayer",
        blocks=("WavLMEncoderLayer", "WavLMNoLayerNormConvLayer", "WavLMGroupNormConvLayer"),
    ),
    _case(
        "whisper",
        "audio",
        _build(
            "WhisperConfig",
            "WhisperForConditionalGeneration",
            d_model=32,
            encoder_layers=3,
            decoder_layers=3,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_source_positions=16,
            max_target_positions=16,
            num_mel_bins=16,
        ),
        whisper_inputs,
        "WhisperEncoderLayer",
        "WhisperDecoderLayer",
        cached=True,
    ),
)


def resnet50_layout() -> nn.Module:
    """The ``resnet`` case's model (a factory for ``torchkiln plan plan_zoo:resnet50_layout``)."""
    return next(case for case in CASES if case.name == "resnet").build()
