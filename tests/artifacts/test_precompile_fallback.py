"""The normally compiled function a precompiled group keeps for the calls its loaded functions
do not fit is built by the first such call, not at ``torchkiln.compile``: a model whose calls
all fit never builds its ``torch.compile`` wrapper (nor imports the backend's compile stack).
Every safety check stays: a misfit call warns and is compiled, a strict one raises, a
rejected directory compiles the group at ``torchkiln.compile`` as before."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import clear_compilation_metrics

import torchkiln
import torchkiln.plugins.backends as builtin_backends
from torchkiln.artifacts.directory import ArtifactError
from torchkiln.artifacts.precompiled import ArtifactWarning
from torchkiln.errors import RegionCompileError

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))
from precompile_models import inputs, stack  # noqa: E402

# Every test precompiles (or loads what the module fixture precompiled): torch 2.13+ only.
pytestmark = pytest.mark.needs_feature("precompiled artifacts")


@pytest.fixture
def builds(fresh_dynamo: None, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the functions the built-in backend plugin wrapped in ``torch.compile``
    (the real ``compile_with_torch`` still runs)."""
    clear_compilation_metrics()
    seen: list[str] = []
    real = builtin_backends.compile_with_torch

    def spy(fn: Callable[..., Any], config: Any, backend: str | None = None) -> Any:
        seen.append(fn.__name__)
        return real(fn, config, backend)

    monkeypatch.setattr(builtin_backends, "compile_with_torch", spy)
    return seen


def _loaded(artifacts: Path, **options: Any) -> torch.nn.Module:
    return torchkiln.compile(
        stack(), backend="aot_eager", artifacts=str(artifacts), progress="off", **options
    )


def _eager(x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return stack()(x)


def test_calls_that_fit_never_build_the_fallback(artifacts: Path, builds: list[str]) -> None:
    model = _loaded(artifacts)
    assert builds == []
    with torch.no_grad():
        out = model(inputs())
        model(inputs())
    assert builds == []
    torch.testing.assert_close(out, _eager(inputs()))


def test_the_first_misfit_call_builds_the_fallback_once(artifacts: Path, builds: list[str]) -> None:
    model = _loaded(artifacts)
    other = inputs(batch=5)
    misfit = pytest.warns(ArtifactWarning, match="does not fit this call")
    with misfit as caught, torch.no_grad():
        out = model(other)
        again = model(other)
        fits = model(inputs())  # the precompiled shape still runs its loaded function
    assert len(caught) == 1
    assert len(builds) == 1 and builds[0].startswith("torchkiln_Block")
    torch.testing.assert_close(out, _eager(other))
    torch.testing.assert_close(again, out)
    torch.testing.assert_close(fits, _eager(inputs()))
    # The group is served by the directory's functions, the backend's code for the misfits.
    report = torchkiln.report(model)
    assert report.regions[0].status == "serving" and report.regions[0].graphs == 1
    assert "3 calls fit; 6 ran the backend's code" in str(report)  # 3 blocks, 2 misfits


def test_strict_raises_before_building_anything(artifacts: Path, builds: list[str]) -> None:
    model = _loaded(artifacts, artifacts_strict=True)
    with pytest.raises(ArtifactError, match="artifacts_strict"), torch.no_grad():
        model(inputs(batch=5))
    assert builds == []


def test_rejected_artifacts_compile_the_group_at_compile_time(
    artifacts: Path, builds: list[str]
) -> None:
    with pytest.warns(ArtifactWarning, match="dtype: precompiled with 'float32'"):
        model = torchkiln.compile(
            stack().double(), backend="aot_eager", artifacts=str(artifacts), progress="off"
        )
    assert len(builds) == 1  # as without artifacts: compile_region ran for the group
    with torch.no_grad():
        model(inputs().double())


def _failing_build(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(fn: Callable[..., Any], config: Any, backend: str | None = None) -> Any:
        raise RuntimeError("the backend is gone")

    monkeypatch.setattr(builtin_backends, "compile_with_torch", broken)


@pytest.mark.parametrize("policy", ["eager", "raise"])
def test_a_fallback_that_fails_to_build_follows_the_region_error_policy(
    artifacts: Path, builds: list[str], monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    """``eager``: the calls that needed the fallback run eagerly, with a warning; ``raise``:
    the error, naming the cause."""
    model = _loaded(artifacts, on_region_error=policy)
    _failing_build(monkeypatch)
    misfit = pytest.warns(ArtifactWarning, match="does not fit")
    outcome = (
        pytest.warns(RuntimeWarning, match="runs eagerly .*the backend is gone")
        if policy == "eager"
        else pytest.raises(RegionCompileError, match="the backend is gone")
    )
    out = None
    with misfit, outcome, torch.no_grad():
        out = model(inputs(batch=5))
    if policy == "eager":
        torch.testing.assert_close(out, _eager(inputs(batch=5)))
    else:
        assert out is None
