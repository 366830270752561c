"""The real backend: inductor compiles a Llama's blocks (C++ on this CPU) once for all of them,
and a second compilation is served from inductor's caches, which the report counts."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch._dynamo
from engine_zoo import graphs_compiled, llama, token_ids
from torch._dynamo.utils import counters

import torchkiln

pytestmark = pytest.mark.slow


@pytest.fixture
def inductor_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cold cache of this test's own, so the first compile misses and the second hits."""
    cache = tmp_path / "inductor-cache"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    return cache


def test_inductor_compiles_llama_blocks_once_and_hits_its_cache(inductor_cache: Path) -> None:
    model = llama()
    twin = copy.deepcopy(model)
    ids = token_ids()
    with torch.no_grad():
        expected = twin(ids).logits

        torchkiln.compile(model, backend="inductor", progress="off")
        torch.testing.assert_close(model(ids).logits, expected, rtol=1e-4, atol=1e-4)
        assert graphs_compiled() == 1
        regions = torchkiln.report(model).regions
        assert [r.status for r in regions] == ["compiled"] * 3
        assert [r.reused for r in regions] == [False, True, True]
        assert regions[0].compile_seconds > 0 and regions[0].cache_hits == 0
        assert any(inductor_cache.rglob("*.py"))  # inductor wrote its code there

        # Same model, fresh Dynamo: the FX graph comes from the cache now.
        torchkiln.decompile(model)
        torch._dynamo.reset()
        counters.clear()
        torchkiln.compile(model, backend="inductor", progress="off")
        torch.testing.assert_close(model(ids).logits, expected, rtol=1e-4, atol=1e-4)
        first = torchkiln.report(model).regions[0]
        assert first.graphs == 1 and first.cache_hits >= 1
