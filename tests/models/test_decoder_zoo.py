"""The decoder zoo (``tox -e slow``): every architecture in :mod:`decoder_zoo`, built from its
default config with tiny sizes, compiles the same graphs at depths 12 and 13 (both past
Dynamo's recompile limit of 8) with no eager region, and matches eager on the forward, one
training step and a greedy 8-token ``generate()``.

Graphs are counted per block class, over the three workloads together. Architectures that
alternate layer types (Gemma 2 and 3: sliding-window and full-attention layers) compile a
variant per type, since the types differ in code paths and mask; the count is still the same
at every depth.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from decoder_zoo import DECODERS, Decoder, run

pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

WORKLOADS = ("forward", "train", "generate")


@pytest.fixture(autouse=True)
def fresh_dynamo(reset_dynamo: None, torchkiln_clean_environment: None) -> Iterator[None]:
    yield


@pytest.mark.parametrize("decoder", DECODERS, ids=lambda decoder: decoder.name)
def test_one_block_per_class_at_any_depth(decoder: Decoder) -> None:
    outcomes = {depth: run(decoder, depth, WORKLOADS) for depth in (12, 13)}
    for depth, outcome in outcomes.items():
        assert outcome.eager_regions == (), (depth, outcome.eager_regions)
        assert outcome.mismatches() == [], depth
        assert outcome.breaks == 0, depth
    variants = layer_types(decoder)
    assert outcomes[12].graphs == outcomes[13].graphs <= 8 * variants


def layer_types(decoder: Decoder) -> int:
    """Kinds of layer the config mixes (Gemma: sliding-window and full attention), else 1."""
    return len(set(getattr(decoder.build(12).config, "layer_types", None) or ["one"]))


def test_the_zoo_has_at_least_15_architectures() -> None:
    assert len({decoder.config for decoder in DECODERS}) >= 15
