"""Compile is all or nothing: a failure leaves the model and the process exactly as found, and a
retry with a good configuration works. Decompile goes by module identity and restores
process-wide settings per model, whatever the order."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_zoo import MlpBlock, NestedListModel, token_ids
from fingerprint import Fingerprint
from torch import nn

import torchkiln
from torchkiln.artifacts.cache import CACHE_DIR_ENV
from torchkiln.engine.region_runtime import RegionFallbackWarning
from torchkiln.plugin import (
    BackendSpec,
    DistributedResult,
    DistributedSpec,
    Region,
    RegionGroup,
    RegionPlan,
    SelectorSpec,
)


def assert_untouched(model: nn.Module, before: Fingerprint) -> None:
    assert not torchkiln.is_compiled(model)
    assert Fingerprint.of(model).differences(before) == []


def assert_retry_works(model: nn.Module, pm: torchkiln.PluginManager) -> None:
    expected = model(token_ids())
    torchkiln.compile(model, plugins=pm, backend="eager", progress="off")
    torch.testing.assert_close(model(token_ids()), expected)
    assert {r.status for r in torchkiln.report(model).regions} == {"compiled"}


class Strategy:
    """Declares distributed strategy ``odd``, which calls ``compile_regions`` and then
    misbehaves as told."""

    def __init__(self, after: Callable[[nn.Module], Any]):
        self.after = after

    @torchkiln.hookimpl
    def declare_distributed(self) -> list[DistributedSpec]:
        return [DistributedSpec("odd", "misbehaves on purpose (tests)")]

    @torchkiln.hookimpl
    def wrap_distributed(
        self, model: nn.Module, strategy: str, compile_regions: Callable[[nn.Module], None]
    ) -> Any:
        if strategy != "odd":
            return None
        compile_regions(model)
        return self.after(model)


def raise_after_setting_flags(model: nn.Module) -> Any:
    import torch._dynamo.config as dynamo_config

    dynamo_config.capture_scalar_outputs = not dynamo_config.capture_scalar_outputs
    os.environ["TORCHKILN_TEST_LEFTOVER"] = "1"
    model.__dict__["_odd_marker"] = True
    raise RuntimeError("engine on fire")


@pytest.mark.parametrize(
    ("after", "message"),
    [
        (raise_after_setting_flags, r"plugin 'odd' raised in wrap_distributed\(\): RuntimeError"),
        (lambda model: 42, r"plugin 'odd': wrap_distributed\(\) returned int 42; expected"),
        (
            lambda model: DistributedResult(wrapped=model, module=nn.Linear(1, 1), strategy="odd"),
            r"plugin 'odd' \(strategy 'odd'\) returned module Linear instead of the model it was given",
        ),
    ],
    ids=["raises", "returns-garbage", "bad-result"],
)
def test_a_failing_strategy_after_compile_regions_rolls_everything_back(
    pm: torchkiln.PluginManager, after: Callable[[nn.Module], Any], message: str
) -> None:
    pm.register(Strategy(after), name="odd")
    model = NestedListModel()
    before = Fingerprint.of(model)
    with pytest.raises(torchkiln.TorchkilnError, match=message):
        torchkiln.compile(model, plugins=pm, backend="eager", distributed="odd", progress="off")
    assert_untouched(model, before)
    assert "TORCHKILN_TEST_LEFTOVER" not in os.environ
    assert_retry_works(model, pm)


def test_cache_dir_pointing_at_a_file_is_refused_untouched(
    pm: torchkiln.PluginManager, tmp_path: Path
) -> None:
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("x")
    model = NestedListModel()
    before = Fingerprint.of(model)
    with pytest.raises(torchkiln.TorchkilnError, match=r"cache_dir .* is not a directory"):
        torchkiln.compile(model, plugins=pm, backend="eager", cache_dir=str(a_file / "sub"))
    assert_untouched(model, before)
    assert_retry_works(model, pm)


class PlanOf:
    """Declares selector ``fixed``, whose plan ``make(model)`` builds."""

    def __init__(self, make: Callable[[nn.Module], RegionPlan]):
        self.make = make

    @torchkiln.hookimpl
    def declare_selectors(self) -> list[SelectorSpec]:
        return [SelectorSpec("fixed")]

    @torchkiln.hookimpl
    def select_regions(self, model: nn.Module, selector: str) -> RegionPlan | None:
        return self.make(model) if selector == "fixed" else None


def _group(model: nn.Module, name: str, *paths: str) -> RegionGroup:
    return RegionGroup(name, tuple(Region(p, model.get_submodule(p), name) for p in paths))


def _missing_path(model: nn.Module) -> RegionPlan:
    block = model.get_submodule("stages.0.0")
    return RegionPlan("fixed", (RegionGroup("B", (Region("stages.9.0", block, "B"),)),))


def _empty_group(model: nn.Module) -> RegionPlan:
    return RegionPlan("fixed", (_group(model, "B", "stages.0.0"), RegionGroup("E", ())))


def _listed_twice(model: nn.Module) -> RegionPlan:
    return RegionPlan(
        "fixed", (_group(model, "B", "stages.0.0", "stages.0.1"), _group(model, "C", "stages.0.0"))
    )


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_missing_path, r"stages\.9\.0 is not a submodule of the model"),
        (_empty_group, r"group 'E' has no regions"),
        (_listed_twice, r"stages\.0\.0 is listed twice \(also as stages\.0\.0\)"),
        (lambda model: "layers", r"returned str 'layers'; expected a torchkiln\.RegionPlan"),
    ],
    ids=["path-not-in-model", "empty-group", "module-twice", "not-a-plan"],
)
def test_a_bad_plan_is_refused_before_anything_is_touched(
    pm: torchkiln.PluginManager, make: Callable[[nn.Module], RegionPlan], message: str
) -> None:
    pm.register(PlanOf(make), name="fixed-plan")
    model = NestedListModel()
    before = Fingerprint.of(model)
    with pytest.raises(torchkiln.PluginError, match=r"plugin 'fixed-plan'.*" + message) as raised:
        torchkiln.compile(model, plugins=pm, backend="eager", regions="fixed")
    assert (raised.value.plugin, raised.value.hook) == ("fixed-plan", "select_regions")
    assert_untouched(model, before)
    with pytest.raises(torchkiln.PluginError, match=message):
        torchkiln.plan(model, plugins=pm, regions="fixed")
    assert_retry_works(model, pm)


def test_cache_dirs_are_restored_per_model_whatever_the_order(
    pm: torchkiln.PluginManager, tmp_path: Path
) -> None:
    original = os.environ.get(CACHE_DIR_ENV)
    a = torchkiln.compile(
        NestedListModel(), plugins=pm, backend="eager", cache_dir=str(tmp_path / "x")
    )
    b = torchkiln.compile(
        NestedListModel(), plugins=pm, backend="eager", cache_dir=str(tmp_path / "y")
    )
    assert os.environ[CACHE_DIR_ENV] == str(tmp_path / "y")
    torchkiln.decompile(a)
    assert os.environ[CACHE_DIR_ENV] == str(tmp_path / "y")  # b still holds it
    torchkiln.decompile(b)
    assert os.environ.get(CACHE_DIR_ENV) == original


def test_a_held_setting_goes_back_after_the_last_holder_in_any_order() -> None:
    import torch._dynamo.config as dynamo_config

    from torchkiln.plugins.fsdp2 import DYNAMO_FLAGS, set_dynamo_flags

    start = {name: getattr(dynamo_config, name) for name in DYNAMO_FLAGS}
    first, second = nn.Linear(1, 1), nn.Linear(1, 1)
    undo_first, undo_second = set_dynamo_flags(first), set_dynamo_flags(second)
    assert all(getattr(dynamo_config, name) for name in DYNAMO_FLAGS)
    undo_first()
    assert all(getattr(dynamo_config, name) for name in DYNAMO_FLAGS)  # second still holds
    undo_second()
    assert {name: getattr(dynamo_config, name) for name in DYNAMO_FLAGS} == start


class Container(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(MlpBlock() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


@pytest.mark.parametrize("edit", ["delete", "replace"])
def test_decompile_after_the_user_edits_the_model(pm: torchkiln.PluginManager, edit: str) -> None:
    model = torchkiln.compile(Container(), plugins=pm, backend="eager", progress="off")
    x = torch.randn(2, 4, 32)
    model(x)
    old = model.blocks[1]
    if edit == "delete":
        del model.blocks[1]
    else:
        model.blocks[1] = MlpBlock()
    torchkiln.decompile(model)
    for module in (*model.modules(), old):
        assert "forward" not in module.__dict__
        assert "_torchkiln_region" not in module.__dict__
    assert not torchkiln.is_compiled(model)
    model(x)  # plain eager again


def test_a_wrong_shaped_first_input_is_the_users_error(pm: torchkiln.PluginManager) -> None:
    model = Container()
    torchkiln.compile(model, plugins=pm, backend="eager", progress="off")
    with pytest.raises(RuntimeError, match=r"expected input with shape \[\*, 32\]") as raised:
        model(torch.randn(2, 4, 5))
    assert not isinstance(raised.value, torchkiln.TorchkilnError)
    assert [r.status for r in torchkiln.report(model).regions] == ["pending"] * 3
    model(torch.randn(2, 4, 32))
    assert [r.status for r in torchkiln.report(model).regions] == ["compiled"] * 3


def test_a_wrong_shaped_first_input_under_eager_policy_does_not_stick(
    pm: torchkiln.PluginManager, recwarn: pytest.WarningsRecorder
) -> None:
    model = Container()
    torchkiln.compile(model, plugins=pm, backend="eager", on_region_error="eager", progress="off")
    with pytest.raises(RuntimeError, match=r"expected input with shape \[\*, 32\]"):
        model(torch.randn(2, 4, 5))
    model(torch.randn(2, 4, 32))
    assert [r.status for r in torchkiln.report(model).regions] == ["compiled"] * 3
    assert not [w for w in recwarn if issubclass(w.category, RegionFallbackWarning)]


class InterruptOnce(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.interrupt = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.interrupt:
            raise KeyboardInterrupt
        return self.linear(x)


def test_an_interrupted_first_call_is_a_first_call_again(
    pm: torchkiln.PluginManager, capsys: pytest.CaptureFixture[str]
) -> None:
    model = nn.Sequential(InterruptOnce(), InterruptOnce())
    torchkiln.compile(model, plugins=pm, backend="eager", report=True, progress="off")
    with pytest.raises(KeyboardInterrupt):
        model(torch.randn(2, 8))
    assert [r.status for r in torchkiln.report(model).regions] == ["pending"] * 2
    for block in model:
        block.interrupt = False
    model(torch.randn(2, 8))
    # The interrupt came while Dynamo traced the group's code, and Dynamo does not compile
    # that code again: the finished first calls ran eagerly, and the report says so (it once
    # said "compiled", re-derived rather than witnessed).
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list

    [code] = model.__dict__["_torchkiln_compiled"].codes.values()
    ran_compiled = bool(_debug_get_cache_entry_list(code))
    report = torchkiln.report(model)
    assert [r.status for r in report.regions] == ["compiled" if ran_compiled else "eager"] * 2
    assert [r.eager_calls for r in report.regions] == [0 if ran_compiled else 1] * 2
    assert "torchkiln compile report" in capsys.readouterr().err


class FlakyBackend:
    """Declares backend ``flaky``, whose compiler fails its first ``failures`` graphs."""

    def __init__(self, failures: int):
        self.failures = failures

    @torchkiln.hookimpl
    def declare_backends(self) -> list[BackendSpec]:
        return [BackendSpec("flaky", "fails at first (tests)")]

    @torchkiln.hookimpl
    def compile_region(self, fn: Callable[..., Any], backend: str) -> Any:
        return torch.compile(fn, backend=self.compile_graph) if backend == "flaky" else None

    def compile_graph(self, graph_module: torch.fx.GraphModule, example_inputs: Any) -> Any:
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("the compiler service is down")
        return graph_module.forward


def test_a_group_that_failed_once_and_compiled_later_is_compiled(
    pm: torchkiln.PluginManager,
) -> None:
    pm.register(FlakyBackend(failures=1), name="flaky-backend")
    model = Container()
    torchkiln.compile(model, plugins=pm, backend="flaky", progress="off")
    with pytest.raises(torchkiln.RegionCompileError, match=r"plugin 'flaky-backend'"):
        model(torch.randn(2, 4, 32))
    assert torchkiln.report(model).regions[0].status == "failed"
    model(torch.randn(2, 4, 32))
    assert [r.status for r in torchkiln.report(model).regions] == ["compiled"] * 3
