"""The decoder zoo (``tox -e slow``): every architecture in :mod:`decoder_zoo`, built from its
default config with tiny sizes, compiles the same graphs at depths 12 and 13 (both past
Dynamo's recompile limit of 8) with no eager region, and matches eager on the forward, one
training step and a greedy 8-token ``generate()``. The families with state-space caches and
GPT-Neo do the same at depths 12 and 16 on the forward and ``generate()``, witnessed per block
call by a counting backend.

Graphs are counted per block class, over the three workloads together. Architectures that
alternate layer types (Gemma 2 and 3: sliding-window and full-attention layers) compile a
variant per type, since the types differ in code paths and mask; the count is still the same
at every depth.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from decoder_zoo import DECODERS, LAYER_CACHE_DECODERS, Decoder, run

pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

WORKLOADS = ("forward", "train", "generate")
CI_SAMPLE = frozenset({"llama", "gemma2", "gpt2", "mixtral", "mamba", "gpt_neo"})
"""What CI's slow env runs: a plain decoder, alternating layer types, tied embeddings and a
different block, a mixture of experts, a state-space cache, an index attribute named otherwise.
The rest run in ``tox -e zoo`` (by hand; docs/zoo.md has its last measured run)."""


def sampled(decoders: list[Decoder]) -> list[object]:
    return [
        pytest.param(d, id=d.name, marks=() if d.name in CI_SAMPLE else pytest.mark.zoo)
        for d in decoders
    ]


@pytest.fixture(autouse=True)
def fresh_dynamo(reset_dynamo: None, torchkiln_clean_environment: None) -> Iterator[None]:
    yield


@pytest.mark.parametrize("decoder", sampled(DECODERS))
def test_one_block_per_class_at_any_depth(decoder: Decoder) -> None:
    outcomes = {depth: run(decoder, depth, WORKLOADS) for depth in (12, 13)}
    for depth, outcome in outcomes.items():
        assert outcome.eager_regions == (), (depth, outcome.eager_regions)
        assert outcome.mismatches() == [], depth
        assert outcome.breaks == 0, depth
    variants = layer_types(decoder)
    assert outcomes[12].graphs == outcomes[13].graphs <= 8 * variants


@pytest.mark.parametrize("decoder", sampled(LAYER_CACHE_DECODERS))
def test_state_space_caches_and_layer_id_compile_one_block_at_any_depth(decoder: Decoder) -> None:
    """Mamba, FalconMamba, Mamba2 (state-space caches: conv and recurrent updates), Bamba (a
    hybrid cache: Mamba2 and attention layers) and GPT-Neo (its index in ``layer_id``) at
    depths 12 and 16: the same graphs at both depths, no eager
    region, forward logits and ``generate()`` token ids equal to eager's. What ran compiled
    is witnessed by the backend itself: every call of every block ran exactly one compiled
    graph (none eager, none broken), whatever the report says."""
    outcomes = {
        depth: run(decoder, depth, ("forward", "generate"), witness=True) for depth in (12, 16)
    }
    for depth, outcome in outcomes.items():
        assert outcome.eager_regions == (), (depth, outcome.eager_regions)
        assert outcome.mismatches() == [], depth
        assert outcome.breaks == 0, depth
        assert len(outcome.graph_runs) == depth
        assert outcome.eager_calls() == [], depth
        assert {runs for calls in outcome.graph_runs.values() for runs in calls} == {1}, depth
        # forward, prefill and 7 decode steps: 9 calls per block
        assert {len(calls) for calls in outcome.graph_runs.values()} == {9}, depth
    assert outcomes[12].graphs == outcomes[16].graphs <= 4 * layer_types(decoder)


def layer_types(decoder: Decoder) -> int:
    """Kinds of layer the config mixes (Gemma: sliding-window and full attention; GPT-Neo:
    global and local), else 1."""
    config = decoder.build(12).config
    kinds = getattr(config, "attention_layers", None) or getattr(config, "layer_types", None)
    return len(set(kinds or ["one"]))


def test_the_zoo_has_at_least_15_architectures() -> None:
    assert len({decoder.config for decoder in DECODERS}) >= 15
