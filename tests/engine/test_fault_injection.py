"""Fault injection: every hook x (raises, returns garbage, returns None), and backends failing
at trace time, at run time and on the third group.

Each case checks the model is bit-identical to before (module classes, ``forward`` objects,
``__dict__`` keys, hooks, parameter objects and bytes, Dynamo tags, the cache variable and
Dynamo's config), that the error names the plugin, and that a retry with a good configuration
works.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from engine_zoo import AttnBlock, IndexedBlock, MlpBlock
from fingerprint import Fingerprint
from torch import nn

import torchkiln
from torchkiln.engine.region_runtime import RegionFallbackWarning
from torchkiln.plugin import (
    HOOK_NAMES,
    BackendSpec,
    DistributedResult,
    DistributedSpec,
    LayerCacheSpec,
    Region,
    RegionGroup,
    RegionPlan,
    SelectorSpec,
)

PLUGIN = "faulty-plugin"
HOOKS = HOOK_NAMES
FAULTS = ("raises", "garbage", "none")
GARBAGE: dict[str, Any] = {
    "declare_backends": ["faulty"],
    "declare_selectors": "faulty",
    "declare_distributed": [42],
    "declare_layer_caches": [BackendSpec("faulty")],
    "resolve_compile_config": "backend=eager",
    "select_regions": 42,
    "wrap_distributed": 42,
    "prepare_group": 42,
    "compile_region": 42,
}


class ThreeGroups(nn.Module):
    """Three block classes, two of each: three groups."""

    def __init__(self) -> None:
        super().__init__()
        self.mlps = nn.ModuleList(MlpBlock() for _ in range(2))
        self.attns = nn.ModuleList(AttnBlock() for _ in range(2))
        self.indexed = nn.ModuleList(IndexedBlock(i) for i in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in (*self.mlps, *self.attns, *self.indexed):
            x = block(x)
        return x


def inputs() -> torch.Tensor:
    return torch.randn(2, 4, 32, generator=torch.Generator().manual_seed(0))


def blocks_plan(model: nn.Module) -> RegionPlan:
    groups = []
    for container in ("mlps", "attns", "indexed"):
        blocks = model.get_submodule(container)
        name = type(blocks[0]).__name__
        regions = tuple(Region(f"{container}.{i}", b, name) for i, b in enumerate(blocks))
        groups.append(RegionGroup(name, regions))
    return RegionPlan("faulty", tuple(groups), reason="every block")


class Faulty:
    """Backend, selector and strategy ``faulty``; hook ``hook`` misbehaves as ``fault`` says."""

    def __init__(self, hook: str, fault: str) -> None:
        self.hook = hook
        self.fault = fault

    def _answer(self, hook: str, normal: Callable[[], Any]) -> Any:
        if hook != self.hook:
            return normal()
        if self.fault == "raises":
            raise RuntimeError(f"injected fault in {hook}")
        return GARBAGE[hook] if self.fault == "garbage" else None

    @torchkiln.hookimpl
    def declare_backends(self) -> Any:
        return self._answer("declare_backends", lambda: [BackendSpec("faulty")])

    @torchkiln.hookimpl
    def declare_selectors(self) -> Any:
        return self._answer("declare_selectors", lambda: [SelectorSpec("faulty")])

    @torchkiln.hookimpl
    def declare_distributed(self) -> Any:
        return self._answer("declare_distributed", lambda: [DistributedSpec("faulty")])

    @torchkiln.hookimpl
    def declare_layer_caches(self) -> Any:
        return self._answer("declare_layer_caches", lambda: [LayerCacheSpec("faulty", list)])

    @torchkiln.hookimpl
    def resolve_compile_config(self) -> Any:
        return self._answer("resolve_compile_config", lambda: None)

    @torchkiln.hookimpl
    def select_regions(self, model: nn.Module, selector: str) -> Any:
        if selector != "faulty":
            return None
        return self._answer("select_regions", lambda: blocks_plan(model))

    @torchkiln.hookimpl
    def wrap_distributed(
        self, model: nn.Module, strategy: str, compile_regions: Callable[[nn.Module], None]
    ) -> Any:
        if strategy != "faulty":
            return None
        compile_regions(model)  # the fault comes after the regions were compiled in place
        return self._answer(
            "wrap_distributed",
            lambda: DistributedResult(wrapped=model, module=model, strategy="faulty"),
        )

    @torchkiln.hookimpl
    def prepare_group(self, group: RegionGroup, config: Any) -> Any:
        if config.backend != "faulty" or group.name != "AttnBlock":
            return None  # the fault comes after the first group was compiled in place
        return self._answer("prepare_group", lambda: None)

    @torchkiln.hookimpl
    def compile_region(self, fn: Callable[..., Any], backend: str) -> Any:
        if backend != "faulty":
            return None
        return self._answer("compile_region", lambda: torch.compile(fn, backend="eager"))


FAULTY_OPTIONS = {"backend": "faulty", "regions": "faulty", "distributed": "faulty"}


def assert_retry_works(model: nn.Module, expected: torch.Tensor) -> None:
    pm = torchkiln.PluginManager(entry_points=False, env={})
    torchkiln.compile(model, plugins=pm, backend="eager", progress="off")
    torch.testing.assert_close(model(inputs()), expected)
    assert {r.status for r in torchkiln.report(model).regions} == {"compiled"}
    torchkiln.decompile(model)


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_fault_leaves_the_model_bit_identical(hook: str, fault: str) -> None:
    pm = torchkiln.PluginManager(entry_points=False, env={})
    pm.register(Faulty(hook, fault), name=PLUGIN)
    model = ThreeGroups()
    expected = model(inputs())
    before = Fingerprint.of(model)
    if hook in ("resolve_compile_config", "prepare_group", "declare_layer_caches") and (
        fault == "none"
    ):
        # None is the documented "no change": compiling works.
        torchkiln.compile(model, plugins=pm, progress="off", **FAULTY_OPTIONS)
        torch.testing.assert_close(model(inputs()), expected)
        torchkiln.decompile(model)
    elif hook.startswith("declare_") and fault == "none":
        # Declaring nothing: the configured name is unknown, and said so.
        with pytest.raises(torchkiln.ConfigError, match=r"'faulty'"):
            torchkiln.compile(model, plugins=pm, progress="off", **FAULTY_OPTIONS)
    else:
        with pytest.raises(torchkiln.TorchkilnError) as raised:
            torchkiln.compile(model, plugins=pm, progress="off", **FAULTY_OPTIONS)
        assert f"plugin {PLUGIN!r}" in str(raised.value)
        assert hook in str(raised.value)
        assert not isinstance(raised.value.__cause__, AttributeError | KeyError | TypeError)
    assert not torchkiln.is_compiled(model)
    assert Fingerprint.of(model).differences(before) == []
    assert_retry_works(model, expected)


def refuse(graph_module: torch.fx.GraphModule, example_inputs: Any) -> Any:
    raise RuntimeError("the backend refuses this graph")


def fails_when_run(graph_module: torch.fx.GraphModule, example_inputs: Any) -> Any:
    def run(*args: Any) -> Any:
        raise RuntimeError("the compiled code crashed")

    return run


class FailingBackend:
    """Backend ``failing``: compiles with ``backend_fn`` the groups in ``groups`` (every group
    when ``None``), the others with Dynamo's ``eager``."""

    def __init__(self, backend_fn: Callable[..., Any], groups: tuple[str, ...] | None = None):
        self.backend_fn = backend_fn
        self.groups = groups

    @torchkiln.hookimpl
    def declare_backends(self) -> list[BackendSpec]:
        return [BackendSpec("failing")]

    @torchkiln.hookimpl
    def compile_region(self, fn: Callable[..., Any], group: RegionGroup, backend: str) -> Any:
        if backend != "failing":
            return None
        fails = self.groups is None or group.name in self.groups
        return torch.compile(fn, backend=self.backend_fn if fails else "eager")


@pytest.mark.parametrize(
    ("backend_fn", "groups", "failing_region"),
    [
        (refuse, None, "mlps.0"),
        (fails_when_run, None, "mlps.0"),
        (refuse, ("IndexedBlock",), "indexed.0"),
    ],
    ids=["at-trace-time", "at-first-run", "on-the-third-group"],
)
def test_a_backend_failing_at_the_first_call(
    backend_fn: Callable[..., Any], groups: tuple[str, ...] | None, failing_region: str
) -> None:
    pm = torchkiln.PluginManager(entry_points=False, env={})
    pm.register(FailingBackend(backend_fn, groups), name=PLUGIN)
    model = ThreeGroups()
    expected = model(inputs())
    before = Fingerprint.of(model)
    torchkiln.compile(model, plugins=pm, backend="failing", progress="off")
    with pytest.raises(
        torchkiln.RegionCompileError,
        match=rf"region '{failing_region}' .* in compile_region of plugin '{PLUGIN}'",
    ):
        model(inputs())
    statuses = {r.path: r.status for r in torchkiln.report(model).regions}
    assert statuses[failing_region] == "failed"
    torchkiln.decompile(model)
    assert Fingerprint.of(model).differences(before) == []
    assert_retry_works(model, expected)


@pytest.mark.parametrize("backend_fn", [refuse, fails_when_run], ids=["trace", "run"])
def test_a_failing_backend_under_the_eager_policy_gives_eager_outputs(
    backend_fn: Callable[..., Any], recwarn: pytest.WarningsRecorder
) -> None:
    pm = torchkiln.PluginManager(entry_points=False, env={})
    pm.register(FailingBackend(backend_fn, ("AttnBlock",)), name=PLUGIN)
    model = ThreeGroups()
    expected = model(inputs())
    torchkiln.compile(model, plugins=pm, backend="failing", on_region_error="eager", progress="off")
    torch.testing.assert_close(model(inputs()), expected)
    torch.testing.assert_close(model(inputs()), expected)
    statuses = [r.status for r in torchkiln.report(model).regions]
    assert statuses == ["compiled", "compiled", "eager", "eager", "compiled", "compiled"]
    caught = [w for w in recwarn if issubclass(w.category, RegionFallbackWarning)]
    assert any("attns.0 (AttnBlock) runs eagerly" in str(w.message) for w in caught)
