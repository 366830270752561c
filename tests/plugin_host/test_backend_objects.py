"""A backend that carries its compile (``BackendSpec.compile``): no ``compile_region`` hook,
compiled once per group, saved and loaded when it says it can; and what goes wrong is named."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch._dynamo.utils import clear_compilation_metrics, get_compilation_metrics

import torchkiln
from torchkiln.errors import PluginError, RegionCompileError
from torchkiln.plugin import BackendSpec, compile_with_torch, hookimpl

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))
from precompile_models import inputs, stack  # noqa: E402


class CarriedBackend:
    """``carried``: aot_eager, its compile counted, declared with the compile it carries."""

    def __init__(self, returns_none: bool = False):
        self.groups: list[str] = []
        self.returns_none = returns_none

    def compile(self, fn: Any, group: Any, config: Any) -> Any:
        self.groups.append(group.name)
        if self.returns_none:
            return None
        return compile_with_torch(fn, config, backend="aot_eager")

    @hookimpl
    def declare_backends(self) -> list[BackendSpec]:
        return [BackendSpec("carried", modes=(), precompile=True, compile=self.compile)]


@pytest.fixture(autouse=True)
def clean(torchkiln_clean_environment: None, reset_dynamo: None) -> None:
    clear_compilation_metrics()


def test_a_backend_carrying_its_compile_needs_no_compile_region() -> None:
    backend = CarriedBackend()
    pm = torchkiln.PluginManager()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "declares ... but not compile_region" warning
        pm.register(backend, name="carried")
    model = torchkiln.compile(stack(), backend="carried", plugins=pm, progress="off")
    assert backend.groups == ["Block"]  # once per group (3 blocks), at compile time
    with torch.no_grad():
        out = model(inputs())
    torchkiln.decompile(model)
    with torch.no_grad():
        torch.testing.assert_close(out, model(inputs()))
    assert pm.backend("carried").plugin == "carried"


def test_a_carried_compile_returning_none_is_the_declaring_plugins_fault() -> None:
    pm = torchkiln.PluginManager()
    pm.register(CarriedBackend(returns_none=True), name="nothing")
    with pytest.raises(RegionCompileError) as caught:
        torchkiln.compile(stack(), backend="carried", plugins=pm, progress="off")
    assert caught.value.plugin == "nothing"
    assert isinstance(caught.value.__cause__, PluginError)
    assert "BackendSpec.compile returned None" in str(caught.value.__cause__)


@pytest.mark.needs_feature("precompiled artifacts")
def test_a_carried_backend_that_can_save_is_precompiled_and_loaded(tmp_path: Path) -> None:
    backend = CarriedBackend()
    pm = torchkiln.PluginManager()
    pm.register(backend, name="carried")
    result = torchkiln.precompile(stack(), inputs(), tmp_path, backend="carried", plugins=pm)
    assert result.skipped == [], result.summary()
    assert backend.groups and set(backend.groups) == {"Block"}
    torch._dynamo.reset()
    clear_compilation_metrics()
    model = torchkiln.compile(
        stack(), backend="carried", artifacts=str(tmp_path), plugins=pm, progress="off"
    )
    with torch.no_grad():
        model(inputs())
    assert [m for m in get_compilation_metrics() if m.co_name] == []  # loaded, not traced
    assert "calls fit" in torchkiln.report(model).served_from[0]
