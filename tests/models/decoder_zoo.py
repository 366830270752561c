"""Decoder language models from transformers, built from their *default* configs with only the
sizes made tiny (width, depth, heads, experts, vocabulary): KV cache on, default attention,
default cache. Nothing is downloaded.

Each workload runs on an eager copy and on a torchkiln-compiled copy with the same weights and
returns what must match (logits, gradients, generated ids) plus the number of graphs Dynamo
compiled for it.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

import attrs
import torch
import torch._dynamo
from torch import nn
from torch._dynamo.utils import counters

import torchkiln

VOCAB = 128
WIDTH = 64
HEADS = 4
KV_HEADS = 2


@attrs.frozen
class Decoder:
    """One architecture: ``config`` and ``model`` are class names in ``transformers``."""

    name: str
    config: str
    model: str
    sizes: dict[str, Any]
    """Config keywords (sizes only) on top of the common ones; ``{depth}`` keys get the depth."""
    depth_key: str = "num_hidden_layers"
    depth_sizes: Callable[[int], dict[str, Any]] | None = None
    """Sizes that follow the depth (GPT-Neo's layer pattern must have one entry per layer)."""

    def build(self, depth: int) -> nn.Module:
        import transformers

        config_class = getattr(transformers, self.config)
        follows = self.depth_sizes(depth) if self.depth_sizes else {}
        config = config_class(
            **{self.depth_key: depth, "vocab_size": VOCAB, **self.sizes, **follows}
        )
        torch.manual_seed(0)
        return getattr(transformers, self.model)(config).eval()


LLAMA_SIZES = {
    "hidden_size": WIDTH,
    "intermediate_size": 2 * WIDTH,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
}
NO_KV_SIZES = {"hidden_size": WIDTH, "intermediate_size": 2 * WIDTH, "num_attention_heads": HEADS}
MOE = {"num_experts_per_tok": 2}

DECODERS = (
    Decoder("llama", "LlamaConfig", "LlamaForCausalLM", LLAMA_SIZES),
    Decoder("mistral", "MistralConfig", "MistralForCausalLM", {**LLAMA_SIZES, "head_dim": 16}),
    Decoder("qwen2", "Qwen2Config", "Qwen2ForCausalLM", LLAMA_SIZES),
    Decoder(
        "qwen2_moe",
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        {
            **LLAMA_SIZES,
            **MOE,
            "num_experts": 4,
            "moe_intermediate_size": WIDTH,
            "shared_expert_intermediate_size": WIDTH,
        },
    ),
    Decoder(
        "mixtral",
        "MixtralConfig",
        "MixtralForCausalLM",
        {**LLAMA_SIZES, **MOE, "num_local_experts": 4},
    ),
    # Phi-3's default pad_token_id (32000) must fit the vocabulary: keep its default size.
    Decoder("phi3", "Phi3Config", "Phi3ForCausalLM", {**LLAMA_SIZES, "vocab_size": 32064}),
    Decoder("gemma2", "Gemma2Config", "Gemma2ForCausalLM", {**LLAMA_SIZES, "head_dim": 16}),
    Decoder(
        "gemma3_text", "Gemma3TextConfig", "Gemma3ForCausalLM", {**LLAMA_SIZES, "head_dim": 16}
    ),
    Decoder("gpt2", "GPT2Config", "GPT2LMHeadModel", {"n_embd": WIDTH, "n_head": HEADS}, "n_layer"),
    Decoder("gpt_neox", "GPTNeoXConfig", "GPTNeoXForCausalLM", NO_KV_SIZES),
    Decoder(
        "falcon",
        "FalconConfig",
        "FalconForCausalLM",
        {"hidden_size": WIDTH, "num_attention_heads": HEADS},
    ),
    Decoder(
        "opt",
        "OPTConfig",
        "OPTForCausalLM",
        {
            "hidden_size": WIDTH,
            "ffn_dim": 2 * WIDTH,
            "num_attention_heads": HEADS,
            "word_embed_proj_dim": WIDTH,
        },
    ),
    Decoder(
        "bloom",
        "BloomConfig",
        "BloomForCausalLM",
        {"hidden_size": WIDTH, "n_head": HEADS},
        "n_layer",
    ),
    Decoder("stablelm", "StableLmConfig", "StableLmForCausalLM", LLAMA_SIZES),
    Decoder("starcoder2", "Starcoder2Config", "Starcoder2ForCausalLM", LLAMA_SIZES),
    Decoder("olmo", "OlmoConfig", "OlmoForCausalLM", LLAMA_SIZES),
    Decoder("olmo2", "Olmo2Config", "Olmo2ForCausalLM", LLAMA_SIZES),
    Decoder("qwen3", "Qwen3Config", "Qwen3ForCausalLM", {**LLAMA_SIZES, "head_dim": 16}),
    Decoder("phi", "PhiConfig", "PhiForCausalLM", NO_KV_SIZES),
    Decoder("granite", "GraniteConfig", "GraniteForCausalLM", LLAMA_SIZES),
)
BY_NAME = {decoder.name: decoder for decoder in DECODERS}

SSM_SIZES = {"hidden_size": WIDTH, "state_size": 16}
LAYER_CACHE_DECODERS = (
    # State-space caches: the blocks call get/update_conv_state and get/update_recurrent_state.
    Decoder("mamba", "MambaConfig", "MambaForCausalLM", SSM_SIZES),
    Decoder("falcon_mamba", "FalconMambaConfig", "FalconMambaForCausalLM", SSM_SIZES),
    # Mamba2: hidden_size * expand (2) == num_heads * head_dim, and n_groups (8) divides num_heads.
    Decoder(
        "mamba2",
        "Mamba2Config",
        "Mamba2ForCausalLM",
        {**SSM_SIZES, "num_heads": 8, "head_dim": 16},
    ),
    # Bamba: a hybrid cache (Mamba2 layers' conv and recurrent states, every 4th layer attention).
    Decoder(
        "bamba",
        "BambaConfig",
        "BambaForCausalLM",
        {
            **LLAMA_SIZES,
            "mamba_n_heads": 8,
            "mamba_d_head": 16,
            "mamba_d_state": 16,
        },
        depth_sizes=lambda depth: {"attn_layer_indices": list(range(3, depth, 4))},
    ),
    # GPT-Neo keeps its index in layer_id; its default pattern alternates global and local layers.
    Decoder(
        "gpt_neo",
        "GPTNeoConfig",
        "GPTNeoForCausalLM",
        {"hidden_size": WIDTH, "num_heads": HEADS},
        "num_layers",
        lambda depth: {"attention_types": [[["global", "local"], depth // 2]]},
    ),
)
"""Families whose caches or layer indices the adapter once missed (issue 24)."""
BY_NAME.update({decoder.name: decoder for decoder in LAYER_CACHE_DECODERS})


def token_ids(batch: int = 2, seq: int = 12, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(1, VOCAB, (batch, seq), generator=generator)


def forward(model: nn.Module, ids: torch.Tensor) -> list[torch.Tensor]:
    with torch.no_grad():
        return [model(ids).logits]


def training_step(model: nn.Module, ids: torch.Tensor) -> list[torch.Tensor]:
    """Forward with labels and backward, in training mode. Dropout stays as configured; the
    seed makes eager and compiled draw the same masks (the ``eager`` backend keeps op order)."""
    model.train()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    output = model(ids, labels=ids)
    output.loss.backward()
    model.eval()
    return [output.loss.detach()] + [p.grad for p in model.parameters() if p.grad is not None]


def generate(model: nn.Module, ids: torch.Tensor, **options: Any) -> list[torch.Tensor]:
    with torch.no_grad():
        return [model.generate(ids, max_new_tokens=8, do_sample=False, **options)]


WORKLOADS: dict[str, Callable[[nn.Module, torch.Tensor], list[torch.Tensor]]] = {
    "forward": forward,
    "train": training_step,
    "generate": generate,
    "generate_static": functools.partial(generate, cache_implementation="static"),
}


@attrs.frozen
class Outcome:
    eager: dict[str, list[torch.Tensor]]
    compiled: dict[str, list[torch.Tensor]]
    graphs: int
    """Graphs Dynamo compiled during the compiled runs (every group, every workload)."""
    eager_regions: tuple[str, ...]
    """Regions the report marks eager, and recompile-limit hits after the first calls."""
    breaks: int
    graph_runs: dict[str, list[int]] = attrs.Factory(dict)
    """With ``witness=True``: compiled graphs run in each call of each region, by path, counted
    by the backend itself (:class:`GraphRuns`), not taken from torchkiln's report."""

    def eager_calls(self) -> list[str]:
        """Region calls that ran no compiled graph (``path#call``), as the backend saw them."""
        return [
            f"{path}#{call}"
            for path, runs in self.graph_runs.items()
            for call, count in enumerate(runs)
            if count == 0
        ]

    def mismatches(self, atol: float = 1e-5, rtol: float = 1e-4) -> list[str]:
        """Workloads whose compiled results differ from eager's (ids exactly, floats closely)."""
        return [
            workload
            for workload, expected in self.eager.items()
            if not same(expected, self.compiled[workload], atol, rtol)
        ]


def same(
    expected: list[torch.Tensor], actual: list[torch.Tensor], atol: float, rtol: float
) -> bool:
    if len(expected) != len(actual):
        return False
    return all(
        torch.allclose(a, b, atol=atol, rtol=rtol) if a.is_floating_point() else torch.equal(a, b)
        for a, b in zip(expected, actual, strict=True)
    )


class GraphRuns:
    """An independent witness of what ran compiled: ``backend=COUNTING`` is Dynamo's ``eager``
    backend (the captured graph run as Python) that counts every run of a compiled graph."""

    count = 0

    @staticmethod
    def backend(graph: torch.fx.GraphModule, example_inputs: object) -> Callable[..., Any]:
        def counted(*args: Any) -> Any:
            GraphRuns.count += 1
            return graph.forward(*args)

        return counted


COUNTING = "kiln_counting"


def witness_region_calls(model: nn.Module, paths: list[str]) -> dict[str, list[int]]:
    """Hooks on each region's module that record how many compiled graphs ran during each of
    its calls (module hooks run around whatever ``forward`` torchkiln installed)."""
    runs: dict[str, list[int]] = {path: [] for path in paths}
    for path in paths:
        module = model.get_submodule(path)
        start: list[int] = []
        module.register_forward_pre_hook(lambda *_, start=start: start.append(GraphRuns.count))
        module.register_forward_hook(
            lambda *_, start=start, calls=runs[path]: calls.append(GraphRuns.count - start.pop())
        )
    return runs


def run(
    decoder: Decoder,
    depth: int,
    workloads: tuple[str, ...],
    backend: str = "eager",
    witness: bool = False,
) -> Outcome:
    """``workloads`` in turn on an eager model, then on a torchkiln-compiled copy (same weights,
    fresh Dynamo): what they returned, and what compiling cost in graphs, eager regions and
    graph breaks. ``witness``: compile with the counting backend and record the graphs each
    region call ran (:attr:`Outcome.graph_runs`)."""
    model = decoder.build(depth)
    compiled_model = copy.deepcopy(model)
    ids = token_ids()
    expected = {workload: WORKLOADS[workload](model, ids) for workload in workloads}
    torch._dynamo.reset()
    counters.clear()
    runs: dict[str, list[int]] = {}
    if witness:
        if COUNTING not in torch._dynamo.list_backends(exclude_tags=()):
            torch._dynamo.register_backend(GraphRuns.backend, name=COUNTING)
        backend = COUNTING
        paths = [region.path for region in torchkiln.plan(compiled_model).regions()]
        runs = witness_region_calls(compiled_model, paths)
    torchkiln.compile(compiled_model, backend=backend)
    actual = {workload: WORKLOADS[workload](compiled_model, ids) for workload in workloads}
    return Outcome(
        expected,
        actual,
        counters["stats"]["unique_graphs"],
        eager_regions(compiled_model),
        sum(counters["graph_break"].values()),
        runs,
    )


def eager_regions(model: nn.Module) -> tuple[str, ...]:
    """What ``torchkiln.report`` says runs eagerly: regions, and groups that hit Dynamo's
    recompile limit after the first calls."""
    report = torchkiln.report(model)
    limit_hits = tuple(
        f"{group}: {reason}"
        for group, reasons in report.later_recompiles.items()
        for reason in reasons
        if "limit" in reason
    )
    return tuple(r.path for r in report.regions if r.status != "compiled") + limit_hits
