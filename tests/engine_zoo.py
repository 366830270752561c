"""Models for the engine tests: real transformers models built from tiny configs (no download)
and pure-PyTorch toys with blocks in every kind of container.

The toy classes live here, in an importable module, so a decompiled model can be pickled whole
(``torch.save(model)``) and loaded back.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchkiln
import torchkiln.examples
from torchkiln.testing import output_tensors

WIDTH = 32
VOCAB = 256

# --- toy blocks ---------------------------------------------------------------------------------


class MlpBlock(nn.Module):
    """Pre-norm residual MLP."""

    def __init__(self, width: int = WIDTH) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class AttnBlock(nn.Module):
    """Pre-norm residual causal self-attention (a second block type)."""

    def __init__(self, width: int = WIDTH, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(self.norm(x)).view(batch, seq, 3, self.heads, -1).unbind(2)
        attended = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return x + self.out(attended.transpose(1, 2).reshape(batch, seq, width))


class IndexedBlock(nn.Module):
    """A block whose forward reads an integer ``layer_idx`` attribute, as many real ones do."""

    def __init__(self, layer_idx: int, width: int = WIDTH) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.linear(x)) / (self.layer_idx + 1)


# --- toy models ---------------------------------------------------------------------------------


class Embedded(nn.Module):
    """Embedding, ``body`` (some container of blocks, iterated by ``run_body``), norm, head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def run_body(self, hidden: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.run_body(self.embed(input_ids))))


class DictModel(Embedded):
    """Blocks in an ``nn.ModuleDict``."""

    def __init__(self, depth: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleDict({f"block_{i}": MlpBlock() for i in range(depth)})

    def run_body(self, hidden: torch.Tensor) -> torch.Tensor:
        for block in self.blocks.values():
            hidden = block(hidden)
        return hidden


class NestedListModel(Embedded):
    """Blocks in an ``nn.ModuleList`` of ``nn.ModuleList`` stages."""

    def __init__(self, stages: int = 2, per_stage: int = 2) -> None:
        super().__init__()
        self.stages = nn.ModuleList(
            nn.ModuleList(MlpBlock() for _ in range(per_stage)) for _ in range(stages)
        )

    def run_body(self, hidden: torch.Tensor) -> torch.Tensor:
        for stage in self.stages:
            for block in stage:
                hidden = block(hidden)
        return hidden


class HybridModel(Embedded):
    """Two block types interleaved in one list (attention, MLP, attention, MLP)."""

    def __init__(self, pairs: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            block for _ in range(pairs) for block in (AttnBlock(), MlpBlock())
        )

    def run_body(self, hidden: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            hidden = layer(hidden)
        return hidden


class IndexedStack(nn.Module):
    """``depth`` :class:`IndexedBlock` s, each with its own ``layer_idx``."""

    def __init__(self, depth: int = 12) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(IndexedBlock(i) for i in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def sequential_model(depth: int = 3) -> nn.Sequential:
    """The root itself an ``nn.Sequential``: a stem, blocks, a norm.

    The stem makes every block's input require grad; without it the first block would see an
    input that does not and the rest inputs that do, which Dynamo guards on (two graphs)."""
    return nn.Sequential(
        nn.Linear(WIDTH, WIDTH), *(MlpBlock() for _ in range(depth)), nn.LayerNorm(WIDTH)
    )


# --- transformers models (tiny configs, random weights) -----------------------------------------


def llama() -> nn.Module:
    pytest.importorskip("transformers", reason="llama is a transformers model")
    return torchkiln.examples.llama(
        depth=3, hidden_size=64, heads=4, kv_heads=2, intermediate_size=128, vocab_size=VOCAB
    )


def gpt2() -> nn.Module:
    pytest.importorskip("transformers", reason="gpt2 is a transformers model")
    return torchkiln.examples.gpt2(depth=2, hidden_size=64, heads=4, vocab_size=VOCAB)


def bert() -> nn.Module:
    pytest.importorskip("transformers", reason="bert is a transformers model")
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertModel(config)


def t5() -> nn.Module:
    pytest.importorskip("transformers", reason="t5 is a transformers model")
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        vocab_size=VOCAB,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=3,
        num_decoder_layers=3,
        num_heads=4,
        dropout_rate=0.0,
        use_cache=False,
    )
    return T5ForConditionalGeneration(config)


def qwen2_moe() -> nn.Module:
    pytest.importorskip("transformers", reason="qwen2_moe is a transformers model")
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    config = Qwen2MoeConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=4,
        num_experts_per_tok=2,
        use_cache=False,
        max_position_embeddings=128,
    )
    return Qwen2MoeForCausalLM(config)


# --- the cases ----------------------------------------------------------------------------------


def token_ids(batch: int = 2, seq: int = 8, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _ids() -> dict[str, Any]:
    return {"input_ids": token_ids()}


def _encoder_decoder_ids() -> dict[str, Any]:
    return {"input_ids": token_ids(seq=8), "decoder_input_ids": token_ids(seq=5, seed=2)}


def _hidden() -> dict[str, Any]:
    return {"input": torch.randn(2, 8, WIDTH, generator=torch.Generator().manual_seed(1))}


@attrs.frozen
class ModelCase:
    """One model of the matrix, with what torchkiln should make of it."""

    name: str
    factory: Callable[[], nn.Module] = attrs.field(repr=False)
    make_inputs: Callable[[], dict[str, Any]] = attrs.field(repr=False)
    groups: Mapping[str, int]
    """Expected region groups (``regions="auto"``): group name -> number of regions."""
    graphs: int
    """Graphs Dynamo compiles in the first call (backend ``eager``): one per group, unless a
    group's regions differ in what Dynamo guards on (T5, see its case)."""
    train_backend: str = "aot_eager"
    """Backend of the gradient test (AOTAutograd compiles the backward too)."""

    def build(self) -> nn.Module:
        """A fresh copy of the model (built once per process, seeded, in eval mode)."""
        return _built(self.factory)

    def inputs(self) -> dict[str, Any]:
        return self.make_inputs()


@functools.cache
def _cached(factory: Callable[[], nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    return factory().eval()


def _built(factory: Callable[[], nn.Module]) -> nn.Module:
    import copy

    return copy.deepcopy(_cached(factory))


CASES = (
    ModelCase("llama", llama, _ids, {"LlamaDecoderLayer": 3}, graphs=1),
    ModelCase("gpt2", gpt2, _ids, {"GPT2Block": 2}, graphs=1),
    # BertModel names BertEmbeddings in _no_split_modules too, but it occurs once: not a block.
    ModelCase("bert", bert, _ids, {"BertLayer": 2}, graphs=1),
    # Block 0 of each T5 stack computes the position bias (it holds the bias table), so it has
    # a shape of its own; the decoder's blocks add cross-attention. Groups are shapes: the
    # other encoder blocks, the other decoder blocks, and the feed-forward part that both
    # block 0s share (one recompile: the decoder's sequence is shorter). 4 graphs.
    # aot_eager takes 20 s on its 4 forward and backward graphs here: eager keeps the test short.
    ModelCase(
        "t5",
        t5,
        _encoder_decoder_ids,
        {"T5LayerFF": 2, "T5Block": 2, "T5Block_2": 2},
        graphs=4,
        train_backend="eager",
    ),
    ModelCase("qwen2_moe", qwen2_moe, _ids, {"Qwen2MoeDecoderLayer": 2}, graphs=1),
    ModelCase("hybrid", HybridModel, _ids, {"AttnBlock": 2, "MlpBlock": 2}, graphs=2),
    ModelCase("sequential", sequential_model, _hidden, {"MlpBlock": 3}, graphs=1),
    ModelCase("module_dict", DictModel, _ids, {"MlpBlock": 3}, graphs=1),
    ModelCase("nested_lists", NestedListModel, _ids, {"MlpBlock": 4}, graphs=1),
    ModelCase(
        "nn_transformer",
        lambda: torchkiln.examples.toy(depth=3),
        _ids,
        {"TransformerEncoderLayer": 3},
        graphs=1,
    ),
)


tensors = output_tensors  # every tensor in a model output, in order


def graphs_compiled() -> int:
    """Graphs Dynamo compiled since the counters were last cleared."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


# --- a backend that counts how often its graphs run ---------------------------------------------


@attrs.define
class GraphRun:
    graph: int
    """Index of the compiled graph, in compile order."""
    autocast: bool
    """Whether CPU autocast was on while the graph ran."""


class CountingBackend:
    """A torchkiln plugin declaring backend ``counting``: Dynamo captures graphs as usual, and
    every run of a compiled graph is recorded, so a test sees compiled code actually running."""

    name = "counting"

    def __init__(self) -> None:
        self.compiled = 0
        self.runs: list[GraphRun] = []

    @torchkiln.hookimpl
    def declare_backends(self) -> list[Any]:
        from torchkiln.plugin import BackendSpec

        return [BackendSpec(self.name, "records every run of a compiled graph (tests)")]

    @torchkiln.hookimpl
    def compile_region(self, fn: Callable[..., Any], backend: str) -> Callable[..., Any] | None:
        if backend != self.name:
            return None
        return torch.compile(fn, backend=self._backend)

    def _backend(
        self, graph_module: torch.fx.GraphModule, example_inputs: Any
    ) -> Callable[..., Any]:
        index = self.compiled
        self.compiled += 1

        def run(*args: Any) -> Any:
            self.runs.append(GraphRun(index, torch.is_autocast_enabled("cpu")))
            return graph_module(*args)

        return run
