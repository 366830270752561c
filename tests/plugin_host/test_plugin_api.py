"""Plugin API v2: the one public module, v1 import paths, the ``prepare_group`` hook, undo actions."""

from __future__ import annotations

import ast
import contextlib
import importlib
import re
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from stack_model import Stack
from torch import nn
from torch._dynamo.utils import counters

import torchkiln
import torchkiln.plugin
from torchkiln.engine.compile_state import state_of
from torchkiln.plugin import GroupPreparation, PluginError, add_undo
from torchkiln.testing import isolated_plugin_manager

ROOT = Path(__file__).resolve().parents[2]

V1_NAMES = [
    ("torchkiln.specs", "BackendSpec"),
    ("torchkiln.specs", "SelectorSpec"),
    ("torchkiln.specs", "DistributedSpec"),
    ("torchkiln.specs", "Availability"),
    ("torchkiln.regions", "Region"),
    ("torchkiln.regions", "RegionGroup"),
    ("torchkiln.regions", "RegionPlan"),
    ("torchkiln.regions", "EagerPart"),
    ("torchkiln.hookspecs", "hookimpl"),
    ("torchkiln.distributed", "DistributedResult"),
]


@pytest.mark.parametrize(("module", "name"), V1_NAMES)
def test_v1_import_warns_naming_the_new_import_and_gives_the_same_object(
    module: str, name: str
) -> None:
    old = importlib.import_module(module)
    with pytest.warns(DeprecationWarning) as caught:
        value = getattr(old, name)
    assert str(caught[0].message) == (
        f"{module}.{name} is deprecated: use `from torchkiln.plugin import {name}` "
        "(torchkiln plugin API v2)"
    )
    assert caught[0].filename == __file__  # points at the importing line, not at torchkiln
    assert value is getattr(torchkiln.plugin, name)


def test_v1_module_refuses_unknown_names() -> None:
    import torchkiln.specs

    with pytest.raises(AttributeError, match=r"'torchkiln\.specs' has no attribute 'Backend'"):
        torchkiln.specs.Backend  # noqa: B018


V1_PLUGIN = '''
"""A third-party plugin written against the v1 docs."""
import torch
from torchkiln import hookimpl
from torchkiln.specs import BackendSpec, SelectorSpec
from torchkiln.regions import Region, RegionGroup, RegionPlan


@hookimpl
def declare_backends():
    return [BackendSpec("v1backend", "aot_eager, the v1 way")]


@hookimpl
def declare_selectors():
    return [SelectorSpec("v1last", "the last child only")]


@hookimpl
def select_regions(model, config, selector):
    if selector != "v1last":
        return None
    path, child = list(model.named_children())[-1]
    group = RegionGroup(type(child).__name__, (Region(path, child, type(child).__name__),))
    return RegionPlan("v1last", (group,), reason="last child")


@hookimpl
def compile_region(fn, group, config, backend):
    if backend != "v1backend":
        return None
    return torch.compile(fn, backend="aot_eager")
'''


def test_a_v1_plugin_still_loads_and_compiles_with_deprecation_warnings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reset_dynamo: None
) -> None:
    (tmp_path / "v1plugin.py").write_text(textwrap.dedent(V1_PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "v1plugin", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plugin = importlib.import_module("v1plugin")
    messages = {str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)}
    assert "torchkiln.specs.BackendSpec is deprecated: use `from torchkiln.plugin import BackendSpec` (torchkiln plugin API v2)" in messages  # fmt: skip
    assert any("torchkiln.regions.RegionPlan" in m for m in messages)
    model = Stack()
    x = torch.randn(2, 8)
    expected = model(x)
    pm = isolated_plugin_manager(plugin)
    torchkiln.compile(model, backend="v1backend", regions="v1last", plugins=pm)
    torch.testing.assert_close(model(x), expected)
    assert [r.path for r in torchkiln.report(model).regions if r.status == "compiled"] == ["head"]


# --- the public surface ------------------------------------------------------------------------


def _torchkiln_imports(path: Path) -> list[str]:
    modules = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torchkiln"):
            modules.append(node.module)
        elif isinstance(node, ast.Import):
            modules += [a.name for a in node.names if a.name.startswith("torchkiln")]
    return modules


PLUGIN_FILES = sorted(
    [
        *(ROOT / "plugins").glob("*.py"),
        *(ROOT / "contrib").glob("*/torchkiln_*/*.py"),
    ]
)


@pytest.mark.parametrize("path", PLUGIN_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_plugins_import_only_the_public_api(path: Path) -> None:
    allowed = {"torchkiln", "torchkiln.plugin", "torchkiln.plugins"}
    # Another built-in plugin is an ordinary installed module (a model adapter building on the
    # transformers one, say); torchkiln's core modules are not. torchkiln._internals is the one
    # adapter for private torch/transformers names, for every module (docs/internals.md).
    private = [
        m
        for m in _torchkiln_imports(path)
        if m not in allowed
        and m != "torchkiln._internals"
        and not m.startswith(("torchkiln.compat", "torchkiln.plugins.", "torchkiln._internals."))
    ]
    assert private == [], f"{path.name} imports {private}; use torchkiln.plugin"


def test_every_public_name_is_importable_and_listed() -> None:
    for name in torchkiln.plugin.__all__:
        assert getattr(torchkiln.plugin, name) is not None
    assert {"hookimpl", "GroupPreparation", "compile_with_torch", "add_undo"} <= set(
        torchkiln.plugin.__all__
    )


# --- prepare_group -----------------------------------------------------------------------------


class Preparer:
    """A plugin that prepares every group: records what runs where."""

    def __init__(self, label: str, log: list[str]) -> None:
        self.label = label
        self.log = log

    @torchkiln.hookimpl
    def prepare_group(self, model: nn.Module, plan: Any, group: Any, config: Any) -> Any:
        self.log.append(f"{self.label}:prepare:{group.name}")
        return GroupPreparation(
            wrap_traced=self.traced,
            wrap_call=self.call,
            undo=lambda: self.log.append(f"{self.label}:undo"),
        )

    def traced(self, fn: Any) -> Any:
        def wrapper(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            return fn(module, *args, **kwargs) * 2

        return wrapper

    def call(self, compiled: Any) -> Any:
        def wrapper(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            self.log.append(f"{self.label}:call")
            return compiled(module, *args, **kwargs)

        return wrapper


def test_prepare_group_wraps_traced_and_compiled_functions_and_undoes_on_decompile(
    reset_dynamo: None,
) -> None:
    log: list[str] = []
    pm = isolated_plugin_manager()
    pm.register(Preparer("a", log), name="a")
    pm.register(Preparer("b", log), name="b")  # registered last: called first, outermost
    model = Stack()
    x = torch.randn(2, 8)
    eager = [layer(x) for layer in model.blocks]
    torchkiln.compile(model, backend="eager", plugins=pm)
    assert log == ["b:prepare:Block", "a:prepare:Block"]
    log.clear()
    out = [layer(x) for layer in model.blocks]
    # Both wrap_traced wrappers are inside the one graph of the group: each doubles the output.
    for got, want in zip(out, eager, strict=True):
        torch.testing.assert_close(got, want * 4)
    assert counters["stats"]["unique_graphs"] == 1
    assert log == ["b:call", "a:call"] * len(model.blocks)  # eagerly, on every region call
    torchkiln.decompile(model)
    assert log[-2:] == ["a:undo", "b:undo"]  # reverse order
    torch.testing.assert_close(model.blocks[0](x), eager[0])


class TraceSettingsPlugin:
    """Prepares every group with trace settings that record each time they are entered, and
    (through ``comptime``, which runs only while Dynamo traces) whether a trace ran inside."""

    def __init__(self) -> None:
        self.active = False
        self.entered = 0
        self.traced_inside: list[bool] = []

    @torchkiln.hookimpl
    def prepare_group(self, group: Any) -> Any:
        return GroupPreparation(trace_settings=self.settings, wrap_traced=self.traced)

    @contextlib.contextmanager
    def settings(self) -> Iterator[None]:
        self.entered += 1
        self.active = True
        try:
            yield
        finally:
            self.active = False

    def traced(self, fn: Any) -> Any:
        from torch._dynamo.comptime import comptime

        def record(ctx: Any) -> None:
            self.traced_inside.append(self.active)

        def wrapper(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            comptime(record)  # a function made outside the trace: Dynamo calls it while tracing
            return fn(module, *args, **kwargs)

        return wrapper


def test_trace_settings_hold_while_dynamo_compiles_the_group_and_never_on_a_call(
    reset_dynamo: None,
) -> None:
    plugin = TraceSettingsPlugin()
    pm = isolated_plugin_manager()
    pm.register(plugin, name="trace-settings")
    model = Stack(depth=3)
    torchkiln.compile(model, backend="eager", plugins=pm, progress="off")
    x = torch.randn(2, 8)
    expected = Stack(depth=3)(x)
    torch.testing.assert_close(model(x), expected)  # the first calls: one compile
    traces, first = len(plugin.traced_inside), plugin.entered
    assert traces and all(plugin.traced_inside)  # (Dynamo may restart a trace: 1-2 traces)
    assert 1 <= first <= 2  # once per compile of the group (3 blocks), not per block call
    for _ in range(3):  # steady: 9 block calls run compiled code, no setting entered
        torch.testing.assert_close(model(x), expected)
    assert plugin.entered == first and not plugin.active
    assert len(plugin.traced_inside) == traces
    model(torch.randn(5, 8))  # a new shape: a recompile, traced inside the settings again
    assert len(plugin.traced_inside) > traces and all(plugin.traced_inside)
    assert plugin.entered > first and not plugin.active


@pytest.mark.needs_feature("precompiled artifacts")
def test_trace_settings_hold_for_a_precompiled_groups_fallback_compile(
    reset_dynamo: None, tmp_path: Path
) -> None:
    """A call the loaded artifacts do not fit is compiled normally, inside the settings."""
    from precompile_models import inputs, stack

    from torchkiln.artifacts.precompiled import ArtifactWarning

    # Precompiled through the same preparation: its wrap_traced wrapper is part of the entries'
    # key (an entry compiled without it never serves a group that traces through it).
    precompiling = isolated_plugin_manager()
    precompiling.register(TraceSettingsPlugin(), name="trace-settings")
    torchkiln.precompile(stack(), inputs(), tmp_path, backend="aot_eager", plugins=precompiling)
    torch._dynamo.reset()
    plugin = TraceSettingsPlugin()
    pm = isolated_plugin_manager()
    pm.register(plugin, name="trace-settings")
    model = torchkiln.compile(
        stack(), backend="aot_eager", artifacts=str(tmp_path), plugins=pm, progress="off"
    )
    with torch.no_grad():
        model(inputs())  # fits: the loaded function, nothing traced
        assert plugin.traced_inside == [] and plugin.entered == 0
        with pytest.warns(ArtifactWarning, match="does not fit this call"):
            model(inputs(batch=5))
    assert plugin.traced_inside and all(plugin.traced_inside)


def test_prepare_group_forwards_are_installed_and_restored() -> None:
    model = Stack()
    inner = model.blocks[1].linear
    installed = []

    class Marks:
        @torchkiln.hookimpl
        def prepare_group(self, group: Any) -> GroupPreparation:
            def forward(x: torch.Tensor) -> torch.Tensor:
                installed.append(True)
                return torch.zeros_like(x)

            return GroupPreparation(forwards=((inner, forward),))

    pm = isolated_plugin_manager(Marks())
    torchkiln.compile(model, backend="eager", regions="whole", plugins=pm)
    assert "forward" in inner.__dict__
    torchkiln.decompile(model)
    assert "forward" not in inner.__dict__


def test_prepare_group_returning_something_else_is_refused() -> None:
    class Wrong:
        @torchkiln.hookimpl
        def prepare_group(self) -> Any:
            return {"wrap_call": None}

    pm = isolated_plugin_manager(Wrong())
    with pytest.raises(PluginError, match=r"expected torchkiln\.plugin\.GroupPreparation or None"):
        torchkiln.compile(Stack(), backend="eager", plugins=pm)


@pytest.mark.parametrize("field", ["wrap_traced", "wrap_call", "trace_settings", "undo"])
def test_a_preparation_field_that_is_not_callable_is_refused_naming_the_field(field: str) -> None:
    with pytest.raises(TypeError) as raised:
        GroupPreparation(**{field: "not a function"})
    message = str(raised.value)
    assert message.startswith(f"GroupPreparation.{field} must be None or ")
    assert message.endswith("got str 'not a function'")


@pytest.mark.parametrize(
    ("forwards", "expected"),
    [
        ("abc", r"GroupPreparation\.forwards must be an iterable of \(nn\.Module, forward"),
        (((nn.Linear(2, 2),),), r"GroupPreparation\.forwards\[0\] must be an \(nn\.Module, "),
        (((object(), print),), r"GroupPreparation\.forwards\[0\]\[0\] must be an nn\.Module, got"),
        (
            ((nn.Linear(2, 2), print), (nn.Linear(2, 2), 3)),
            r"GroupPreparation\.forwards\[1\]\[1\] must be a callable forward or None, got int 3",
        ),
    ],
)
def test_malformed_forwards_are_refused_naming_the_pair(forwards: Any, expected: str) -> None:
    with pytest.raises(TypeError, match=expected):
        GroupPreparation(forwards=forwards)


def test_forwards_given_as_lists_become_a_tuple_of_pairs() -> None:
    module = nn.Linear(2, 2)
    assert GroupPreparation(forwards=[[module, print]]).forwards == ((module, print),)


def test_a_plugin_building_a_bad_preparation_is_named_and_the_model_is_untouched() -> None:
    model = Stack()
    inner = model.blocks[1].linear

    class Good:
        @torchkiln.hookimpl
        def prepare_group(self) -> GroupPreparation:
            return GroupPreparation(forwards=((inner, lambda x: x),))

    class Bad:
        @torchkiln.hookimpl
        def prepare_group(self) -> GroupPreparation:
            return GroupPreparation(wrap_call=1)  # type: ignore[arg-type]

    pm = isolated_plugin_manager(Good(), Bad())
    plugin_name = pm.get_name(next(p for p in pm.get_plugins() if isinstance(p, Bad)))
    forward_before = model.forward
    with pytest.raises(PluginError) as raised:
        torchkiln.compile(model, backend="eager", plugins=pm)
    assert str(raised.value) == (
        f"plugin {plugin_name!r} raised in prepare_group(): TypeError: GroupPreparation.wrap_call "
        "must be None or a function that wraps the compiled function, got int 1"
    )
    assert "forward" not in inner.__dict__  # the good plugin's forward was never installed
    assert model.forward == forward_before and state_of(model) is None


def test_add_undo_runs_on_decompile_and_refuses_an_uncompiled_model() -> None:
    model = Stack()
    ran: list[str] = []
    assert add_undo(model, lambda: ran.append("x")) is False
    torchkiln.compile(model, backend="eager", plugins=isolated_plugin_manager())
    assert add_undo(model, lambda: ran.append("first")) is True
    assert add_undo(model, lambda: ran.append("second")) is True
    torchkiln.decompile(model)
    assert ran == ["second", "first"]


# --- selectors call selectors through the manager ----------------------------------------------


def test_hierarchical_respects_a_disabled_selectors_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    pm = torchkiln.PluginManager(
        entry_points=False, env={"TORCHKILN_DISABLED_PLUGINS": "torchkiln.selectors"}
    )
    with pytest.raises(
        PluginError,
        match=r"no plugin declares the selector 'repeated' \(plugins disabled by "
        r"TORCHKILN_DISABLED_PLUGINS: torchkiln\.selectors\)",
    ):
        torchkiln.plan(Stack(), regions="hierarchical", plugins=pm)


def test_hierarchical_uses_the_repeated_selector_a_plugin_overrides() -> None:
    class FirstOnly:
        @torchkiln.hookimpl
        def declare_selectors(self) -> list[torchkiln.plugin.SelectorSpec]:
            return [torchkiln.plugin.SelectorSpec("repeated", "the first block only")]

        @torchkiln.hookimpl
        def select_regions(self, model: nn.Module) -> Any:
            block = model.blocks[0]
            group = torchkiln.plugin.RegionGroup(
                "Block", (torchkiln.plugin.Region("blocks.0", block, "Block"),)
            )
            return torchkiln.plugin.RegionPlan("repeated", (group,))

    pm = isolated_plugin_manager(FirstOnly())
    with pytest.warns(RuntimeWarning, match="selector 'repeated' is declared by both"):
        plan = torchkiln.plan(Stack(), regions="hierarchical", plugins=pm)
    assert [r.path for g in plan.nested for r in g.regions] == ["blocks.0"]


# --- names, plugins= arguments, dispatch -------------------------------------------------------


class Unnamed:
    @torchkiln.hookimpl
    def resolve_compile_config(self) -> None:
        return None


def test_unnamed_registrations_get_a_readable_name() -> None:
    pm = isolated_plugin_manager()
    first, second = pm.register(Unnamed()), pm.register(Unnamed())
    assert first == f"{__name__}.Unnamed"
    assert second == f"{__name__}.Unnamed#2"
    assert {info.name: info.kind for info in pm.plugin_infos()}[first] == "registered"


@pytest.mark.parametrize("entry", ["compile", "plan"])
def test_plugins_accepts_a_list_of_plugin_objects(entry: str) -> None:
    calls: list[str] = []

    class Recorder:
        @torchkiln.hookimpl
        def resolve_compile_config(self) -> None:
            calls.append("resolve")

    model = Stack()
    getattr(torchkiln, entry)(model, backend="eager", plugins=[Recorder()])
    assert calls == ["resolve"]


def test_plugins_refuses_something_else_saying_what_it_takes() -> None:
    with pytest.raises(PluginError, match=r"plugins= takes a torchkiln\.PluginManager or a list"):
        torchkiln.plan(Stack(), plugins="torchkiln.backends")


NAME_GUARD = re.compile(r"if (backend|selector|strategy) (!=|not in|==)")


@pytest.mark.parametrize("path", PLUGIN_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_implementation_checks_the_name_it_serves(path: Path) -> None:
    assert NAME_GUARD.findall(path.read_text()) == []


class OptionSelector:
    @torchkiln.hookimpl
    def declare_selectors(self) -> list[torchkiln.plugin.SelectorSpec]:
        return [torchkiln.plugin.SelectorSpec("sized", "by size", options=("min_params",))]

    @torchkiln.hookimpl
    def select_regions(self, model: nn.Module) -> torchkiln.plugin.RegionPlan:
        return torchkiln.plugin.RegionPlan("sized", ())


def test_a_selector_option_typo_is_refused_with_the_closest_key() -> None:
    pm = isolated_plugin_manager(OptionSelector())
    with pytest.raises(torchkiln.ConfigError) as raised:
        torchkiln.plan(
            Stack(), plugins=pm, regions={"strategy": "sized", "options": {"min_param": 1}}
        )
    assert (
        "$.regions.options.min_param (from argument): selector 'sized' does not accept option "
        "'min_param' (did you mean 'min_params'?); allowed: min_params" in str(raised.value)
    )
    plan = torchkiln.plan(
        Stack(), plugins=pm, regions={"strategy": "sized", "options": {"min_params": 1}}
    )
    assert plan.selector == "sized"


def test_builtin_selectors_take_no_options() -> None:
    with pytest.raises(torchkiln.ConfigError, match="selector 'auto' does not accept option 'x'"):
        torchkiln.plan(Stack(), plugins=isolated_plugin_manager(), regions={"options": {"x": 1}})


def test_plugins_listing_shows_options_and_descriptions(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchkiln._internals.tvm_backend import torch_tvm_frontend
    from torchkiln.cli import commands as cli
    from torchkiln.plugins import tvm

    tvm_options = tvm.OPTIONS[torch_tvm_frontend()]  # relay up to torch 2.13, relax from 2.14
    monkeypatch.setenv("TORCHKILN_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert cli.main(["plugins"]) == 0
    out = capsys.readouterr().out
    tvm_row = next(line for line in out.splitlines() if line.strip().startswith("tvm "))
    assert ", ".join(tvm_options) in tvm_row
    auto_row = next(line for line in out.splitlines() if line.strip().startswith("auto "))
    assert "repeated blocks when the model has them" in auto_row
    listing = cli.plugins_listing()
    selectors = {s["name"]: s for s in listing["selectors"]}
    assert selectors["auto"]["options"] == ()
    backends = {b["name"]: b for b in listing["backends"]}
    assert backends["tvm"]["options"] == tvm_options
