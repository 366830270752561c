"""Each hook's contract, on an isolated ``torchkiln.PluginManager(entry_points=False)``.

Declaration hooks combine per name (last registered wins, with a warning naming both);
``resolve_compile_config`` overrides are validated and attributed to ``plugin:NAME``;
``select_regions`` / ``wrap_distributed`` / ``compile_region`` go only to the declaring plugin, and what
``compile_region`` returns is what the regions run.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from stack_model import Stack
from torch import nn

import torchkiln
from torchkiln import ConfigError, PluginError, hookimpl
from torchkiln.engine.resolve import resolve_config
from torchkiln.plugin import (
    Availability,
    BackendSpec,
    DistributedResult,
    DistributedSpec,
    Region,
    RegionGroup,
    RegionPlan,
    SelectorSpec,
)
from torchkiln.plugin_host import plugin_info

# --- declaration hooks ---------------------------------------------------------------------------

DECLARATIONS = [
    pytest.param("declare_backends", BackendSpec, "backends", "backend", id="backends"),
    pytest.param("declare_selectors", SelectorSpec, "selectors", "selector", id="selectors"),
    pytest.param(
        "declare_distributed",
        DistributedSpec,
        "distributed_strategies",
        "distributed strategy",
        id="distributed",
    ),
]


def declaring(hook_name: str, *specs: Any) -> object:
    """A plugin object whose ``hook_name`` implementation returns ``specs``."""

    def declare() -> list[Any]:
        return list(specs)

    return type("Declaring", (), {hook_name: staticmethod(hookimpl(declare))})()


@pytest.mark.parametrize(("hook_name", "spec_class", "accessor", "kind"), DECLARATIONS)
def test_declarations_from_every_plugin_are_combined(
    pm: torchkiln.PluginManager, hook_name: str, spec_class: type, accessor: str, kind: str
) -> None:
    before = set(getattr(pm, accessor)())
    pm.register(declaring(hook_name, spec_class("alpha")), name="plugin-a")
    pm.register(declaring(hook_name, spec_class("Beta"), spec_class("gamma")), name="plugin-b")

    declared = getattr(pm, accessor)()

    assert set(declared) - before == {"alpha", "beta", "gamma"}  # names are lower-cased
    assert declared["alpha"].plugin == "plugin-a"
    assert declared["beta"].plugin == declared["gamma"].plugin == "plugin-b"
    assert before <= set(declared)  # the built-ins are still there


@pytest.mark.parametrize(("hook_name", "spec_class", "accessor", "kind"), DECLARATIONS)
def test_duplicate_name_warns_naming_both_plugins_and_the_last_registered_wins(
    pm: torchkiln.PluginManager, hook_name: str, spec_class: type, accessor: str, kind: str
) -> None:
    pm.register(declaring(hook_name, spec_class("twin", description="first")), name="plugin-first")
    pm.register(
        declaring(hook_name, spec_class("twin", description="second")), name="plugin-second"
    )

    with pytest.warns(RuntimeWarning) as caught:
        declared = getattr(pm, accessor)()

    messages = [str(w.message) for w in caught if "twin" in str(w.message)]
    assert len(messages) == 1
    assert f"{kind} 'twin'" in messages[0]
    assert "'plugin-first'" in messages[0] and "'plugin-second'" in messages[0]
    assert declared["twin"].plugin == "plugin-second"
    assert declared["twin"].spec.description == "second"


def test_an_external_backend_overrides_a_builtin_of_the_same_name(
    pm: torchkiln.PluginManager,
) -> None:
    pm.register(
        declaring("declare_backends", BackendSpec("EAGER", description="mine")), name="vendor"
    )
    with pytest.warns(
        RuntimeWarning,
        match=r"backend 'eager' is declared by both plugin 'vendor' and plugin 'torchkiln\.backends'; using 'vendor'",
    ):
        eager = pm.backends()["eager"]
    assert (eager.plugin, eager.spec.description) == ("vendor", "mine")


def test_declarations_are_recomputed_when_plugins_change(pm: torchkiln.PluginManager) -> None:
    plugin = declaring("declare_selectors", SelectorSpec("mine"))
    assert "mine" not in pm.selectors()
    pm.register(plugin, name="mine")
    assert "mine" in pm.selectors()
    pm.unregister(plugin)
    assert "mine" not in pm.selectors()


def _broken(hook_name: str, declare: Callable[[], Any]) -> object:
    """A plugin whose ``hook_name`` calls ``declare``, with the hook that would serve it."""

    def serve() -> None:
        return None

    hooks = {hook_name: declare, plugin_info.DECLARATIONS[hook_name].serving_hook: serve}
    return type("Broken", (), {name: staticmethod(hookimpl(f)) for name, f in hooks.items()})()


def _raising() -> list[Any]:
    raise RuntimeError("vendor SDK missing")


@pytest.mark.parametrize(("hook_name", "spec_class", "accessor", "kind"), DECLARATIONS)
@pytest.mark.parametrize(
    ("declare", "detail"),
    [
        (_raising, "raised RuntimeError: vendor SDK missing"),
        (
            lambda: {"name": "x"},
            "returned dict {'name': 'x'}; expected a list of torchkiln.plugin.",
        ),
    ],
    ids=["raises", "wrong-type"],
)
def test_a_declare_hook_that_fails_quarantines_its_plugin_only(
    pm: torchkiln.PluginManager,
    hook_name: str,
    spec_class: type,
    accessor: str,
    kind: str,
    declare: Callable[[], Any],
    detail: str,
) -> None:
    before = set(getattr(pm, accessor)())
    pm.register(_broken(hook_name, declare), name="broken-vendor")
    pm.register(declaring(hook_name, spec_class("fine")), name="fine-vendor")
    with pytest.warns(RuntimeWarning, match="plugin 'broken-vendor' was quarantined") as caught:
        declared = getattr(pm, accessor)()
    # Every other plugin is unaffected: the built-ins' names and the other vendor's.
    assert set(declared) == before | {"fine"}
    assert pm.get_plugin("broken-vendor") is None
    (failure,) = [f for f in pm.failed if f.name == "broken-vendor"]
    assert (failure.hook, failure.target, failure.distribution) == (hook_name, None, None)
    assert failure.error.startswith(detail)
    assert f"its {hook_name}() {detail}" in str(caught[0].message)
    assert f"plugin 'broken-vendor' (its {hook_name}() {detail}" in pm.missing_hint()
    assert len(caught) == 1  # said once, not on every later call
    getattr(pm, accessor)()


@pytest.mark.parametrize(("hook_name", "spec_class", "accessor", "kind"), DECLARATIONS)
def test_a_failing_declare_hook_raises_under_strict_plugins(
    hook_name: str, spec_class: type, accessor: str, kind: str
) -> None:
    pm = torchkiln.PluginManager(entry_points=False, env={"TORCHKILN_STRICT_PLUGINS": "1"})
    pm.register(_broken(hook_name, _raising), name="broken-vendor")
    with pytest.raises(PluginError) as raised:
        getattr(pm, accessor)()
    assert str(raised.value) == (
        f"plugin 'broken-vendor': {hook_name}() raised RuntimeError: vendor SDK missing "
        "(TORCHKILN_STRICT_PLUGINS=1)"
    )
    assert (raised.value.plugin, raised.value.hook) == ("broken-vendor", hook_name)


def test_torch_registry_backends_are_listed_after_declared_ones(
    pm: torchkiln.PluginManager,
) -> None:
    declared = pm.backends(include_torch=False)
    everything = pm.backends()
    torch_only = set(everything) - set(declared)
    assert {"inductor", "eager", "aot_eager", "cudagraphs", "no"} <= set(declared)
    assert "aot_eager_decomp_partition" in torch_only  # a debug backend only torch knows
    assert all(everything[name].spec.origin == "torch" for name in torch_only)
    assert all(everything[name].plugin == "torch" for name in torch_only)


# --- resolve_compile_config ------------------------------------------------------------------------


class Override:
    """A resolve_compile_config plugin returning fixed overrides and recording its calls."""

    def __init__(self, overrides: dict[str, Any] | None) -> None:
        self.overrides = overrides
        self.seen: list[tuple[torchkiln.CompileConfig, dict[str, str]]] = []

    @hookimpl
    def resolve_compile_config(
        self, config: torchkiln.CompileConfig, sources: dict[str, str]
    ) -> Any:
        self.seen.append((config, dict(sources)))
        return self.overrides


def test_overrides_are_applied_with_source_plugin_name(pm: torchkiln.PluginManager) -> None:
    plugin = Override({"backend": "eager", "regions": {"strategy": "whole"}})
    pm.register(plugin, name="site-policy")

    resolved = resolve_config(plugins=pm, env={}, fullgraph=True)

    assert resolved.config.backend == "eager"
    assert resolved.config.regions.strategy == "whole"
    assert resolved.config.fullgraph is True
    assert resolved.sources["backend"] == "plugin:site-policy"
    assert resolved.sources["regions.strategy"] == "plugin:site-policy"
    assert resolved.sources["fullgraph"] == "argument"
    assert resolved.sources["regions.rest"] == "default"
    # The plugin saw the validated configuration and where each value came from.
    [(seen_config, seen_sources)] = plugin.seen
    assert seen_config.backend == "inductor" and seen_config.fullgraph is True
    assert seen_sources["fullgraph"] == "argument" and seen_sources["backend"] == "default"


def test_an_override_accepting_only_config_is_called_with_it(pm: torchkiln.PluginManager) -> None:
    class OnlyConfig:
        @hookimpl
        def resolve_compile_config(self, config: torchkiln.CompileConfig) -> dict[str, Any]:
            return {"progress": "off"} if config.backend == "eager" else {}

    pm.register(OnlyConfig(), name="only-config")
    assert resolve_config(plugins=pm, env={}, backend="eager").config.progress == "off"
    assert resolve_config(plugins=pm, env={}).config.progress == "auto"


def test_a_plugin_returning_none_changes_nothing(pm: torchkiln.PluginManager) -> None:
    pm.register(Override(None), name="quiet")
    resolved = resolve_config(plugins=pm, env={}, backend="aot_eager")
    assert resolved.config == torchkiln.CompileConfig(backend="aot_eager")
    assert {path for path, source in resolved.sources.items() if source != "default"} == {"backend"}


@pytest.mark.parametrize(
    ("override", "path", "fragment"),
    [
        ({"backend": "bogus"}, "$.backend", "'bogus' is not a registered backend"),
        ({"fullgraph": "sometimes"}, "$.fullgraph", "expected bool (got 'sometimes')"),
        ({"regions": {"stratgy": "whole"}}, "$.regions.stratgy", "did you mean 'strategy'?"),
        (
            {"backend": "eager", "mode": "max-autotune"},
            "$.mode",
            "allowed: none (leave mode unset)",
        ),
    ],
    ids=["unknown-backend", "wrong-type", "unknown-key", "mode"],
)
def test_a_bad_override_raises_config_error_naming_the_plugin(
    pm: torchkiln.PluginManager, override: dict[str, Any], path: str, fragment: str
) -> None:
    pm.register(Override(override), name="bad-policy")
    with pytest.raises(ConfigError) as raised:
        resolve_config(plugins=pm, env={})
    [problem] = raised.value.problems
    assert problem.path == path
    assert problem.source == "plugin:bad-policy"
    assert fragment in problem.message
    assert f"{path} (from plugin:bad-policy): " in str(raised.value)


def test_two_plugins_setting_one_field_warn_and_the_first_called_wins(
    pm: torchkiln.PluginManager,
) -> None:
    pm.register(Override({"backend": "aot_eager", "progress": "on"}), name="registered-first")
    pm.register(Override({"backend": "eager"}), name="registered-last")  # called first (LIFO)

    with pytest.warns(RuntimeWarning) as caught:
        resolved = resolve_config(plugins=pm, env={})

    [message] = [str(w.message) for w in caught if "resolve_compile_config" in str(w.message)]
    assert (
        "'registered-last'" in message
        and "'registered-first'" in message
        and "'backend'" in message
    )
    assert resolved.config.backend == "eager"
    assert resolved.sources["backend"] == "plugin:registered-last"
    # Fields only one plugin set are kept, with that plugin as the source.
    assert resolved.config.progress == "on"
    assert resolved.sources["progress"] == "plugin:registered-first"


def test_a_resolve_hook_that_raises_is_named(pm: torchkiln.PluginManager) -> None:
    class Raising:
        @hookimpl
        def resolve_compile_config(self) -> None:
            raise KeyError("cluster")

    pm.register(Raising(), name="cluster-policy")
    with pytest.raises(
        PluginError, match=r"plugin 'cluster-policy' raised in resolve_compile_config\(\): KeyError"
    ):
        resolve_config(plugins=pm, env={})


# --- select_regions ----------------------------------------------------------------------------------


class Selector:
    """Declares the selector ``picky``; answers it with the first block only."""

    def __init__(self, answer: bool) -> None:
        self.answer = answer
        self.calls: list[str] = []

    @hookimpl
    def declare_selectors(self) -> list[SelectorSpec]:
        return [SelectorSpec("picky")]

    @hookimpl
    def select_regions(
        self, model: nn.Module, config: torchkiln.CompileConfig, selector: str
    ) -> RegionPlan | None:
        self.calls.append(selector)
        if not self.answer:
            return None
        block = model.get_submodule("blocks.0")
        group = RegionGroup("first-block", (Region("blocks.0", block, "first-block"),), "picked")
        return RegionPlan("picky", (group,), reason="only the first block")


def test_select_regions_asks_only_the_declaring_plugin(
    pm: torchkiln.PluginManager, stack: Stack
) -> None:
    with pytest.warns(RuntimeWarning, match="selector 'picky'"):
        lower, upper = Selector(answer=True), Selector(answer=True)
        pm.register(lower, name="lower")
        pm.register(upper, name="upper")  # registered last: called first
        plan = torchkiln.plan(stack, plugins=pm, backend="eager", regions="picky")
    assert [r.path for r in plan.regions()] == ["blocks.0"]
    assert upper.calls == ["picky"]
    assert lower.calls == []  # never asked: only the declaring plugin serves the name


def test_select_regions_returning_none_names_the_declaring_plugin(
    pm: torchkiln.PluginManager, stack: Stack
) -> None:
    answering, declining = Selector(answer=True), Selector(answer=False)
    pm.register(answering, name="answering")
    with pytest.warns(RuntimeWarning, match="selector 'picky'"):
        pm.register(declining, name="declining")
        with pytest.raises(
            PluginError,
            match="plugin 'declining' declares selector 'picky' but its select_regions returned "
            "None for it",
        ):
            torchkiln.plan(stack, plugins=pm, backend="eager", regions={"strategy": "picky"})
    assert declining.calls == ["picky"] and answering.calls == []


def test_builtin_selectors_answer_when_no_plugin_does(
    pm: torchkiln.PluginManager, stack: Stack
) -> None:
    pm.register(Selector(answer=False), name="declining")
    plan = torchkiln.plan(stack, plugins=pm, backend="eager")
    assert plan.selector == "repeated"
    assert [r.path for r in plan.regions()] == ["blocks.0", "blocks.1", "blocks.2"]


# --- wrap_distributed ----------------------------------------------------------------------------------


class Wrapper:
    """Declares distributed strategy ``custom``; calls ``compile_regions`` ``times`` times."""

    def __init__(self, times: int) -> None:
        self.times = times
        self.plans: list[RegionPlan] = []

    @hookimpl
    def declare_distributed(self) -> list[DistributedSpec]:
        return [DistributedSpec("custom")]

    @hookimpl
    def wrap_distributed(
        self,
        model: nn.Module,
        plan: RegionPlan,
        strategy: str,
        compile_regions: Callable[[nn.Module], None],
    ) -> DistributedResult | None:
        self.plans.append(plan)
        for _ in range(self.times):
            compile_regions(model)
        return DistributedResult(wrapped=model, module=model, strategy="custom")


def test_wrap_distributed_that_calls_compile_regions_once_compiles_the_model(
    pm: torchkiln.PluginManager, stack: Stack, reset_dynamo: None
) -> None:
    wrapper = Wrapper(times=1)
    pm.register(wrapper, name="custom-engine")
    result = torchkiln.compile(stack, plugins=pm, backend="eager", distributed="custom")
    assert result is stack
    assert torchkiln.is_compiled(stack)
    [plan] = wrapper.plans
    assert plan.region_count == 3  # the plan select_regions made is the one handed over
    assert "forward" in stack.blocks[0].__dict__


def test_wrap_distributed_that_never_calls_compile_regions_is_an_error(
    pm: torchkiln.PluginManager, stack: Stack
) -> None:
    pm.register(Wrapper(times=0), name="lazy-engine")
    with pytest.raises(
        PluginError,
        match=r"plugin 'lazy-engine' \(strategy 'custom'\) called compile_regions 0 times in "
        r"wrap_distributed\(\); it must call it exactly once",
    ):
        torchkiln.compile(stack, plugins=pm, backend="eager", distributed="custom")


def test_wrap_distributed_that_calls_compile_regions_twice_is_an_error(
    pm: torchkiln.PluginManager, stack: Stack
) -> None:
    pm.register(Wrapper(times=2), name="eager-engine")
    with pytest.raises(
        PluginError,
        match=r"plugin 'eager-engine' \(strategy 'custom'\) called compile_regions twice",
    ):
        torchkiln.compile(stack, plugins=pm, backend="eager", distributed="custom")


def test_wrap_distributed_asks_only_the_declaring_plugin(
    pm: torchkiln.PluginManager, stack: Stack, reset_dynamo: None
) -> None:
    lower, upper = Wrapper(times=1), Wrapper(times=1)
    with pytest.warns(RuntimeWarning, match="distributed strategy 'custom'"):
        pm.register(lower, name="lower")
        pm.register(upper, name="upper")
        torchkiln.compile(stack, plugins=pm, backend="eager", distributed="custom")
    assert (len(upper.plans), len(lower.plans)) == (1, 0)


# --- compile_region --------------------------------------------------------------------------------------


class CountingBackend:
    """Backend ``countback``: its compiled function counts how often the regions run it."""

    def __init__(self) -> None:
        self.compile_calls: list[tuple[str, int, str]] = []
        self.runs = 0

    @hookimpl
    def declare_backends(self) -> list[BackendSpec]:
        return [BackendSpec("countback", "counts region calls", modes=())]

    @hookimpl
    def compile_region(
        self,
        fn: Callable[..., Any],
        group: RegionGroup,
        config: torchkiln.CompileConfig,
        backend: str,
    ) -> Callable[..., Any] | None:
        self.compile_calls.append((group.name, len(group.regions), backend))

        def counted(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            self.runs += 1
            return fn(module, *args, **kwargs)

        return counted


def test_compile_region_return_value_is_what_the_regions_run(
    pm: torchkiln.PluginManager, stack: Stack
) -> None:
    backend = CountingBackend()
    pm.register(backend, name="counting")
    x = torch.randn(4, 8)
    expected = stack(x)

    torchkiln.compile(stack, plugins=pm, backend="CountBack")
    outputs = [stack(x), stack(x)]

    assert backend.compile_calls == [("Block", 3, "countback")]  # once per group, lower-cased name
    assert backend.runs == 6  # 3 regions x 2 calls
    for output in outputs:
        torch.testing.assert_close(output, expected)
    torchkiln.decompile(stack)
    stack(x)
    assert backend.runs == 6  # decompiled: the original forward runs again


class Unanswered:
    """Declares backend ``silent`` but never answers compile_region for it."""

    @hookimpl
    def declare_backends(self) -> list[BackendSpec]:
        return [BackendSpec("silent")]


@pytest.mark.parametrize("policy", ["raise", "eager"])
def test_a_declared_backend_nobody_compiles_is_refused_at_configuration(
    pm: torchkiln.PluginManager, stack: Stack, policy: str
) -> None:
    # Reported when the plugin is registered, naming it ...
    with pytest.warns(
        RuntimeWarning,
        match="plugin 'unanswered' implements declare_backends but not compile_region",
    ):
        pm.register(Unanswered(), name="unanswered")
    # ... and refused like an unknown name when a configuration uses it, before anything is
    # compiled: under on_region_error="eager" it must not quietly run eagerly (issue 25, B7).
    with pytest.raises(torchkiln.ConfigError) as raised:
        torchkiln.compile(stack, plugins=pm, backend="silent", on_region_error=policy)
    unusable = (
        "plugin 'unanswered' declares backend 'silent' but does not implement compile_region, "
        "so the name cannot be used"
    )
    assert f"$.backend (from argument): {unusable}" in str(raised.value)
    assert not torchkiln.is_compiled(stack)
    with pytest.raises(torchkiln.ConfigError, match=re.escape(unusable)):
        torchkiln.plan(stack, plugins=pm, backend="silent")


def test_an_unavailable_backend_is_refused_before_anything_compiles(
    pm: torchkiln.PluginManager, stack: Stack
) -> None:
    class Ghost:
        @hookimpl
        def declare_backends(self) -> list[BackendSpec]:
            return [BackendSpec("ghost", probe=lambda: Availability.no("pip install ghost-sdk"))]

    pm.register(Ghost(), name="ghost")
    with pytest.raises(
        ConfigError, match=re.escape("backend 'ghost' is not available here: pip install ghost-sdk")
    ):
        torchkiln.compile(stack, plugins=pm, backend="ghost")
    assert not torchkiln.is_compiled(stack)


def test_pluggy_own_tracing_still_works(pm: torchkiln.PluginManager, stack: Stack) -> None:
    # torchkiln's TORCHKILN_TRACE_PLUGINS flag must not shadow pluggy's PluginManager.trace.
    written: list[str] = []
    pm.trace.root.setwriter(written.append)
    undo = pm.enable_tracing()
    try:
        torchkiln.plan(stack, plugins=pm, backend="eager")
    finally:
        undo()
    assert any("select_regions" in line for line in written)
