"""Wrappers (``@hookimpl(wrapper=True)`` and ``@hookimpl(hookwrapper=True)``) on every hook.

torchkiln calls each of its nine hooks through pluggy, one plain implementation per call inside
every wrapper (``torchkiln.plugin_host.hook_calls``). These tests wrap all nine during a real
``torchkiln.compile`` and first call of a small Llama and a ``torchkiln plugins`` listing, and
check that each wrapper saw each call with its arguments and result, that what a wrapper
returns is what torchkiln uses, that faults still name the plugin at fault, and that what
pluggy cannot run is refused when the plugin is registered.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import attrs
import pluggy
import pytest
import torch

import torchkiln
import torchkiln.examples
from torchkiln.cli.commands import main
from torchkiln.errors import PluginError, RegionCompileError
from torchkiln.plugin import (
    HOOK_NAMES,
    BackendSpec,
    GroupPreparation,
    RegionPlan,
    SelectorSpec,
    hookimpl,
)
from torchkiln.plugin_host.hook_calls import call_implementation, plain_implementations
from torchkiln.testing import isolated_plugin_manager, small_inputs, small_model

WATCHED = " (watched)"
OLD_STYLE_NOTE = "seen by an old-style wrapper"


def _key(kwargs: dict[str, Any]) -> str | None:
    """The argument that says what a call was for (``None`` for the declaration hooks)."""
    if "config" in kwargs:
        return str(kwargs["config"].backend)
    if "group" in kwargs:
        return str(kwargs["group"].name)
    name = kwargs.get("selector", kwargs.get("strategy"))
    return None if name is None else str(name)


class NewStyleWrappers:
    """``wrapper=True`` on all nine hooks: records ``(hook, key argument, result type)``; tags
    the backends' descriptions and counts the calls of every compiled group function."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None, str]] = []
        self.region_calls = 0

    def _record(self, hook: str, result: Any, **kwargs: Any) -> Any:
        self.seen.append((hook, _key(kwargs), type(result).__name__))
        return result

    @hookimpl(wrapper=True)
    def declare_backends(self) -> Iterator[None]:
        result = yield
        self._record("declare_backends", result)
        return [attrs.evolve(spec, description=spec.description + WATCHED) for spec in result]

    @hookimpl(wrapper=True)
    def declare_selectors(self) -> Iterator[None]:
        return self._record("declare_selectors", (yield))

    @hookimpl(wrapper=True)
    def declare_distributed(self) -> Iterator[None]:
        return self._record("declare_distributed", (yield))

    @hookimpl(wrapper=True)
    def declare_layer_caches(self) -> Iterator[None]:
        return self._record("declare_layer_caches", (yield))

    @hookimpl(wrapper=True)
    def resolve_compile_config(self, config: Any) -> Iterator[None]:
        return self._record("resolve_compile_config", (yield), config=config)

    @hookimpl(wrapper=True)
    def select_regions(self, selector: str) -> Iterator[None]:
        return self._record("select_regions", (yield), selector=selector)

    @hookimpl(wrapper=True)
    def wrap_distributed(self, strategy: str) -> Iterator[None]:
        return self._record("wrap_distributed", (yield), strategy=strategy)

    @hookimpl(wrapper=True)
    def prepare_group(self, group: Any) -> Iterator[None]:
        return self._record("prepare_group", (yield), group=group)

    @hookimpl(wrapper=True)
    def compile_region(self, group: Any) -> Iterator[None]:
        compiled = self._record("compile_region", (yield), group=group)

        def counted(module: Any, *args: Any, **kwargs: Any) -> Any:
            self.region_calls += 1
            return compiled(module, *args, **kwargs)

        return counted


class OldStyleWrapper:
    """``hookwrapper=True`` on ``select_regions`` (reads the plan) and ``prepare_group`` (adds a
    note to each group's preparation through ``outcome.force_result``)."""

    def __init__(self) -> None:
        self.plans: list[RegionPlan] = []

    @hookimpl(hookwrapper=True)
    def select_regions(self) -> Iterator[None]:
        outcome = yield
        self.plans.append(outcome.get_result())

    @hookimpl(hookwrapper=True)
    def prepare_group(self) -> Iterator[None]:
        outcome = yield
        preparation = outcome.get_result() or GroupPreparation()
        outcome.force_result(attrs.evolve(preparation, notes=(*preparation.notes, OLD_STYLE_NOTE)))


@pytest.fixture
def llama_compiled() -> tuple[torch.nn.Module, NewStyleWrappers, OldStyleWrapper, torch.Tensor]:
    new, old = NewStyleWrappers(), OldStyleWrapper()
    manager = isolated_plugin_manager()
    manager.register(new, name="new-style")
    manager.register(old, name="old-style")
    model = torchkiln.examples.llama(depth=2).eval()
    ids = torch.randint(0, 4096, (1, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(ids).logits
        torchkiln.compile(model, backend="eager", plugins=manager, progress="off")
        torch.testing.assert_close(model(ids).logits, expected)
    return model, new, old, expected


def test_a_wrapper_sees_every_hook_of_a_compile_and_first_call(llama_compiled: Any) -> None:
    _, new, old, _ = llama_compiled
    assert {hook for hook, _, _ in new.seen} == set(HOOK_NAMES)
    plan = old.plans[0]
    groups = [group.name for group in plan.groups]
    assert groups == ["LlamaDecoderLayer"]
    assert ("resolve_compile_config", "eager", "NoneType") in new.seen
    assert ("select_regions", "auto", "RegionPlan") in new.seen
    assert ("wrap_distributed", "none", "DistributedResult") in new.seen
    assert ("declare_backends", None, "list") in new.seen
    assert ("declare_layer_caches", None, "list") in new.seen
    # One prepare_group call per implementing plugin, one compile_region call per group.
    prepared = [entry for entry in new.seen if entry[0] == "prepare_group"]
    assert {key for _, key, _ in prepared} == {"LlamaDecoderLayer"}
    assert len(prepared) >= 2  # the built-in adapters each answered, each inside the wrapper
    compiled = [(key, kind) for hook, key, kind in new.seen if hook == "compile_region"]
    assert compiled == [("LlamaDecoderLayer", "function")]
    order = [hook for hook, _, _ in new.seen if not hook.startswith("declare_")]
    first = {hook: order.index(hook) for hook in order}
    # wrap_distributed's result comes back after the compile it drives.
    assert (
        first["resolve_compile_config"]
        < first["select_regions"]
        < first["prepare_group"]
        < first["compile_region"]
        < first["wrap_distributed"]
    )


def test_what_a_wrapper_returns_is_what_torchkiln_uses(llama_compiled: Any) -> None:
    model, new, _, _ = llama_compiled
    assert new.region_calls == 2  # compile_region's wrapper wraps both decoder layers' calls
    notes = torchkiln.report(model).notes
    assert any(note == f"LlamaDecoderLayer: {OLD_STYLE_NOTE}" for note in notes), notes


def test_torchkiln_plugins_lists_the_wrappers_and_their_changes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    new = NewStyleWrappers()
    torchkiln.get_plugin_manager().register(new, name="new-style")
    assert main(["plugins", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    info = next(p for p in listing["plugins"] if p["name"] == "new-style")
    assert info["kind"] == "registered"
    assert sorted(info["hooks"]) == sorted(HOOK_NAMES)
    eager = next(b for b in listing["backends"] if b["name"] == "eager")
    assert eager["description"].endswith(WATCHED) and eager["unusable"] is None
    declared = {hook for hook, _, _ in new.seen}
    assert {"declare_backends", "declare_selectors", "declare_distributed"} <= declared


# --- faults with wrappers -------------------------------------------------------------------------


class RaisingSelector:
    @hookimpl
    def declare_selectors(self) -> list[SelectorSpec]:
        return [SelectorSpec("raising", "raises")]

    @hookimpl
    def select_regions(self) -> RegionPlan:
        raise ValueError("no plan today")


class PassingWrapper:
    @hookimpl(wrapper=True)
    def select_regions(self) -> Iterator[None]:
        return (yield)


class FailingWrapper:
    @hookimpl(wrapper=True)
    def select_regions(self) -> Iterator[None]:
        yield
        raise RuntimeError("the wrapper broke")


def test_an_error_a_wrapper_passes_on_names_the_implementation() -> None:
    pm = isolated_plugin_manager()
    pm.register(RaisingSelector(), name="raising-selector")
    pm.register(PassingWrapper(), name="passing-wrapper")
    with pytest.raises(PluginError, match="no plan today") as raised:
        torchkiln.compile(small_model(), regions="raising", backend="eager", plugins=pm)
    assert (raised.value.plugin, raised.value.hook) == ("raising-selector", "select_regions")


def test_an_error_raised_in_a_wrapper_names_the_wrapper() -> None:
    pm = isolated_plugin_manager()
    pm.register(FailingWrapper(), name="failing-wrapper")
    model = small_model()
    with pytest.raises(PluginError, match="the wrapper broke") as raised:
        torchkiln.compile(model, backend="eager", plugins=pm)
    assert (raised.value.plugin, raised.value.hook) == ("failing-wrapper", "select_regions")
    assert not torchkiln.is_compiled(model)


def test_a_backend_objects_compile_error_names_its_plugin_not_the_wrapper() -> None:
    class Broken:
        @hookimpl
        def declare_backends(self) -> list[BackendSpec]:
            def compile_group(fn: Any, group: Any, config: Any) -> Any:
                raise ValueError("no compiler here")

            return [BackendSpec("broken", "raises", compile=compile_group)]

    class Watch:
        @hookimpl(wrapper=True)
        def compile_region(self) -> Iterator[None]:
            return (yield)

    pm = isolated_plugin_manager()
    pm.register(Broken(), name="broken-backend")
    pm.register(Watch(), name="watch")
    with pytest.raises(RegionCompileError, match="no compiler here") as raised:
        torchkiln.compile(small_model(), backend="broken", plugins=pm, on_region_error="raise")
    assert "broken-backend" in str(raised.value)
    assert "watch" not in str(raised.value)


def test_a_failing_declaration_wrapper_quarantines_its_own_plugin() -> None:
    class FailingDeclarationWrapper:
        @hookimpl(wrapper=True)
        def declare_backends(self) -> Iterator[None]:
            yield
            raise RuntimeError("cannot look")

    pm = isolated_plugin_manager()
    pm.register(FailingDeclarationWrapper(), name="failing-declarations")
    with pytest.warns(RuntimeWarning, match="'failing-declarations' was quarantined"):
        backends = pm.backends()
    assert [(f.name, f.hook) for f in pm.failed] == [("failing-declarations", "declare_backends")]
    assert backends["eager"].plugin == "torchkiln.backends"


def test_trace_names_the_implementation_and_its_wrappers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pm = torchkiln.PluginManager(entry_points=False, env={"TORCHKILN_TRACE_PLUGINS": "1"})
    pm.register(PassingWrapper(), name="passing-wrapper")
    torchkiln.compile(small_model(), backend="eager", plugins=pm, progress="off")
    lines = capsys.readouterr().err.splitlines()
    called = next(line for line in lines if line.startswith("torchkiln: hook select_regions("))
    assert called.endswith(" -> plugin torchkiln.selectors inside wrappers [passing-wrapper]")
    assert any(
        line.startswith("torchkiln: hook select_regions [torchkiln.selectors] returned RegionPlan(")
        for line in lines
    )


# --- name-served hooks: the declaring plugin's implementation only, inside every wrapper ----------


def test_a_wrapper_wraps_only_the_declaring_plugins_compile_region() -> None:
    calls: list[str] = []

    class Legacy:  # plugin API v2: its own compile_region serves the backend it declares
        @hookimpl
        def declare_backends(self) -> list[BackendSpec]:
            return [BackendSpec("legacy", "v2 style")]

        @hookimpl
        def compile_region(self, fn: Any, config: Any) -> Any:
            calls.append("legacy")
            return torchkiln.plugin.compile_with_torch(fn, config, "eager")

    class Other:
        @hookimpl
        def compile_region(self, fn: Any) -> Any:
            calls.append("other")
            return fn

    class Watch:
        @hookimpl(wrapper=True)
        def compile_region(self, backend: str) -> Iterator[None]:
            compiled = yield
            calls.append(f"wrapped {backend}")
            return compiled

    pm = isolated_plugin_manager()
    for plugin in (Legacy(), Other(), Watch()):
        pm.register(plugin)
    model = small_model()
    torchkiln.compile(model, backend="legacy", plugins=pm)
    model(small_inputs())
    assert calls == ["legacy", "wrapped legacy"]


# --- what pluggy cannot run is refused at registration ---------------------------------------------


class NotAGenerator:
    @hookimpl(wrapper=True)
    def resolve_compile_config(self) -> None:
        return None


class UnmarkedGenerator:
    @hookimpl
    def prepare_group(self) -> Iterator[None]:
        yield


class BothMarks:
    @hookimpl(wrapper=True, hookwrapper=True)
    def compile_region(self) -> Iterator[None]:
        yield


class UnknownArgument:
    @hookimpl(wrapper=True)
    def select_regions(self, selecter: str) -> Iterator[None]:
        return (yield)


@pytest.mark.parametrize(
    ("plugin", "hook", "message"),
    [
        (NotAGenerator(), "resolve_compile_config", "marked wrapper=True but is not a generator"),
        (UnmarkedGenerator(), "prepare_group", "is a generator function but is not marked"),
        (BothMarks(), "compile_region", "marked both wrapper=True and hookwrapper=True"),
        (UnknownArgument(), "select_regions", "refused by pluggy: Argument(s) {'selecter'}"),
    ],
    ids=["not-a-generator", "unmarked-generator", "both-marks", "unknown-argument"],
)
def test_what_pluggy_cannot_run_is_refused_at_registration(
    plugin: object, hook: str, message: str
) -> None:
    pm = isolated_plugin_manager()
    with pytest.raises(PluginError, match=re.escape(message)) as raised:
        pm.register(plugin, name="bad")
    assert (raised.value.plugin, raised.value.hook) == ("bad", hook)
    assert f"plugin 'bad': its {hook} implementation" in str(raised.value)
    assert pm.get_plugin("bad") is None


def test_a_wrapper_does_not_serve_the_names_its_plugin_declares() -> None:
    class WrapsOnly:
        @hookimpl
        def declare_backends(self) -> list[BackendSpec]:
            return [BackendSpec("wraps-only", "no compile, no compile_region")]

        @hookimpl(wrapper=True)
        def compile_region(self) -> Iterator[None]:
            return (yield)

    pm = isolated_plugin_manager()
    with pytest.warns(RuntimeWarning, match="implements declare_backends but not compile_region"):
        pm.register(WrapsOnly(), name="wraps-only")
    assert "does not implement compile_region" in (pm.unserved(pm.backends()["wraps-only"]) or "")


# --- the one private pluggy entry torchkiln uses ---------------------------------------------------


def test_pluggy_runs_a_chosen_implementation_inside_every_wrapper() -> None:
    """``call_implementation`` relies on ``PluginManager._hookexec(name, impls, kwargs,
    firstresult)``: a pluggy release that changes it fails here first."""
    assert pluggy.PluginManager._hookexec.__code__.co_varnames[1:5] == (
        "hook_name",
        "methods",
        "kwargs",
        "firstresult",
    )
    new = NewStyleWrappers()
    pm = isolated_plugin_manager(new)
    first, *_ = plain_implementations(pm, "declare_selectors")
    result = call_implementation(pm, "declare_selectors", first)
    assert isinstance(result, list)
    assert new.seen == [("declare_selectors", None, "list")]
