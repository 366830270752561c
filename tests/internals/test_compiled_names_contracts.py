"""Contracts of :mod:`torchkiln._internals.compiled_names`, on every supported torch that has
``aot_compile`` (2.11 has none: sharing is refused there, and these tests skip).

The adapter replaces the name maker ``torch._dynamo.output_graph`` calls for a compiled graph's
function; the behaviour it exists for is an AOTAutograd cache hit for a second ``aot_compile``
of the same graph in another process (here: after ``torch._dynamo.reset()``, with the same
seed). Without the adapter the random name keeps the keys apart and the second compile misses.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest
import torch

from torchkiln._internals import compiled_names, dynamo, versions

pytestmark = pytest.mark.skipif(
    versions.feature_problem("precompiled artifacts") is not None,
    reason=str(versions.feature_problem("precompiled artifacts")),
)


def test_this_torch_lets_the_name_be_chosen() -> None:
    """``torch._dynamo.output_graph.make_compiled_fn_name`` (2.15) or ``unique_id`` (2.13)."""
    with compiled_names.stable_compiled_fn_name("a share key") as told:
        assert told, "torch._dynamo.output_graph has neither make_compiled_fn_name nor unique_id"


def _scaled(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x) * 3.0


def _in_another_process() -> Any:
    """``_scaled`` with globals of its own, as another process has them: Dynamo installs the
    compiled function's name there."""
    return types.FunctionType(
        _scaled.__code__, {"torch": torch, "__builtins__": __builtins__}, "_scaled"
    )


def _autograd_cache(seed: str | None, function: Any = _scaled) -> dict[str, int]:
    """One ``aot_compile`` (inductor, a training graph) after a Dynamo reset: the AOTAutograd
    cache's counters it moved."""
    torch._dynamo.reset()
    counters = dynamo.counters()["aot_autograd"]
    before = {k: int(counters[k]) for k in ("autograd_cache_hit", "autograd_cache_miss")}
    compiled = torch.compile(function, backend="inductor", fullgraph=True, dynamic=False)
    x = torch.randn(4, 8, requires_grad=True)
    if seed is None:
        compiled.aot_compile(((x,), {}))
    else:
        with compiled_names.stable_compiled_fn_name(seed):
            compiled.aot_compile(((x,), {}))
    return {k: int(counters[k]) - v for k, v in before.items()}


def test_one_seed_makes_a_second_compile_hit_the_first_ones_autograd_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    uses = compiled_names._uses
    assert _autograd_cache("key one") == {"autograd_cache_hit": 0, "autograd_cache_miss": 1}
    # A second process (its own globals, no uses yet) names it the same way, and hits.
    monkeypatch.setattr(compiled_names, "_uses", {})
    second = _autograd_cache("key one", _in_another_process())
    assert second == {"autograd_cache_hit": 1, "autograd_cache_miss": 0}
    # In one process, a seed's second use is named apart: Dynamo refuses a name twice in one
    # scope (the first compiled function still holds it), so it compiles, and does not fail.
    assert _autograd_cache("key one") == {"autograd_cache_hit": 0, "autograd_cache_miss": 1}
    # The control: torch's own random name misses what the same graph saved before.
    assert _autograd_cache(None)["autograd_cache_hit"] == 0
    monkeypatch.setattr(compiled_names, "_uses", uses)
