"""Per-block guards: blocks that differ only in an integer attribute (``layer_idx``) must share
one compiled function without recompiling per block, and when Dynamo's recompile limit is hit
anyway the report says so."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
import torch
import torch._dynamo
from engine_zoo import WIDTH, IndexedStack, graphs_compiled

import torchkiln

RECOMPILE_LIMIT = 8  # torch._dynamo.config.recompile_limit's default


def hidden(batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 4, WIDTH, generator=torch.Generator().manual_seed(batch))


@pytest.fixture(autouse=True)
def no_grad() -> Iterator[None]:
    """Without autograd, block 0's input (a leaf) and the others' (block outputs) look alike to
    Dynamo's guards, so every recompile counted here is about layer_idx."""
    with torch.no_grad():
        yield


def test_twelve_indexed_blocks_do_not_recompile_per_block() -> None:
    torch.manual_seed(0)
    model = IndexedStack(depth=12)
    twin = copy.deepcopy(model)
    unspec_before = torch._dynamo.config.allow_unspec_int_on_nn_module
    torchkiln.compile(model, backend="eager", progress="off")

    torch.testing.assert_close(model(hidden()), twin(hidden()))
    # One graph specialised on layer_idx == 0, one with layer_idx symbolic for blocks 1..11.
    assert graphs_compiled() <= 2
    report = torchkiln.report(model)
    assert all(r.status == "compiled" for r in report.regions)
    assert not any(r.recompile_limit_hit for r in report.regions)
    assert sum(r.reused for r in report.regions) >= 10
    # No process-wide Dynamo setting is left changed (principle 3).
    assert torch._dynamo.config.allow_unspec_int_on_nn_module is unspec_before


def test_indexed_blocks_stay_shared_when_shapes_change_later() -> None:
    """Later recompiles (a new batch size) must not specialise on layer_idx again."""
    torch.manual_seed(0)
    model = IndexedStack(depth=12)
    twin = copy.deepcopy(model)
    torchkiln.compile(model, backend="eager", progress="off")
    model(hidden(2))
    after_first_call = graphs_compiled()

    for batch in (3, 4, 5):
        torch.testing.assert_close(model(hidden(batch)), twin(hidden(batch)))
    assert graphs_compiled() - after_first_call <= 2  # at most: one static, one dynamic batch
    report = torchkiln.report(model)
    later = [reason for reasons in report.later_recompiles.values() for reason in reasons]
    assert not any("recompile limit" in reason.lower() for reason in later), later
    assert not torch._dynamo.config.allow_unspec_int_on_nn_module


def test_recompile_limit_hit_is_reported() -> None:
    """``dynamic=False`` forbids symbolic ints, so every block specialises its layer_idx: block 8
    hits the limit and from there the group's regions run eagerly. The report says which."""
    torch.manual_seed(0)
    model = IndexedStack(depth=12)
    twin = copy.deepcopy(model)
    assert torch._dynamo.config.recompile_limit == RECOMPILE_LIMIT
    torchkiln.compile(model, backend="eager", dynamic=False, progress="off")

    torch.testing.assert_close(model(hidden()), twin(hidden()))
    assert graphs_compiled() == RECOMPILE_LIMIT
    regions = torchkiln.report(model).regions
    assert [r.graphs for r in regions[:RECOMPILE_LIMIT]] == [1] * RECOMPILE_LIMIT
    assert [r.recompiles for r in regions[:RECOMPILE_LIMIT]] == [0] + [1] * (RECOMPILE_LIMIT - 1)
    assert all("layer_idx" in r.recompile_reasons[0] for r in regions[1:RECOMPILE_LIMIT])
    limit_hit = [r.path for r in regions if r.recompile_limit_hit]
    assert limit_hit == [f"blocks.{RECOMPILE_LIMIT}"]
    eager = regions[RECOMPILE_LIMIT:]
    assert [r.status for r in eager] == ["eager"] * 4
    assert not any(r.reused for r in eager)
    assert all("recompile limit" in (r.fallback_reason or "") for r in eager)
    assert all(r.status == "compiled" for r in regions[:RECOMPILE_LIMIT])
    assert "recompile limit" in str(torchkiln.report(model))
