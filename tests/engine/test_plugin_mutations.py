"""A plugin that changes the model in a hook and then fails: everything torchkiln can put back
is put back (attributes, submodules, an instance ``forward``, train mode, hooks,
``requires_grad``, a rebound ``.data``), and values written in place, which it cannot restore
without a copy of the weights, are named in a ``PluginError`` naming the plugin and the hook
(issue 23, W1). A strategy's faults name the plugin, not only the strategy (U2)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
import torch
from engine_zoo import MlpBlock
from fingerprint import Fingerprint
from test_fault_injection import ThreeGroups, assert_retry_works, blocks_plan, inputs
from torch import nn

import torchkiln
from torchkiln.plugin import BackendSpec, DistributedResult, DistributedSpec, SelectorSpec

PLUGIN = "meddling-plugin"
HOOKS = (
    "declare_backends",
    "declare_selectors",
    "declare_distributed",
    "resolve_compile_config",
    "select_regions",
    "wrap_distributed",
    "prepare_group",
    "compile_region",
)
"""Every hook: the declaration and configuration hooks do not receive the model, but a plugin
can hold it (here, as one built for that model would)."""


def _first_parameter(model: nn.Module) -> nn.Parameter:
    return next(model.parameters())


def _process_settings(model: nn.Module) -> None:
    import torch._dynamo.config as dynamo_config

    os.environ["TORCHKILN_TEST_MEDDLED"] = "1"
    dynamo_config.capture_scalar_outputs = not dynamo_config.capture_scalar_outputs


MUTATIONS: dict[str, Callable[[nn.Module], None]] = {
    "process-settings": _process_settings,
    "parameter-values": lambda m: _first_parameter(m).data.mul_(2),
    "parameter-data-rebound": lambda m: setattr(
        _first_parameter(m), "data", torch.zeros_like(_first_parameter(m))
    ),
    "added-submodule": lambda m: setattr(m, "extra", nn.Linear(1, 1)),
    "instance-forward": lambda m: setattr(m, "forward", lambda x: x),
    "train-mode": lambda m: m.train(),
    "requires-grad": lambda m: _first_parameter(m).requires_grad_(False),
    "hook": lambda m: m.mlps[0].register_forward_hook(lambda *args: None),
    "replaced-child": lambda m: m.mlps.__setitem__(0, MlpBlock()),
    "buffer-values": lambda m: m.register_buffer("steps", torch.zeros(3)) or None,
}


class Meddling:
    """Backend, selector and strategy ``meddling``: in ``hook`` it changes the model, then
    raises."""

    def __init__(self, model: nn.Module, hook: str, mutation: Callable[[nn.Module], None]):
        self.model = model
        self.hook = hook
        self.mutation = mutation

    def _meddle(self, hook: str) -> None:
        if hook == self.hook:
            self.mutation(self.model)
            raise RuntimeError(f"failed in {hook} after changing the model")

    @torchkiln.hookimpl
    def declare_backends(self) -> list[BackendSpec]:
        self._meddle("declare_backends")
        return [BackendSpec("meddling")]

    @torchkiln.hookimpl
    def declare_selectors(self) -> list[SelectorSpec]:
        self._meddle("declare_selectors")
        return [SelectorSpec("meddling")]

    @torchkiln.hookimpl
    def declare_distributed(self) -> list[DistributedSpec]:
        self._meddle("declare_distributed")
        return [DistributedSpec("meddling")]

    @torchkiln.hookimpl
    def resolve_compile_config(self) -> None:
        self._meddle("resolve_compile_config")

    @torchkiln.hookimpl
    def select_regions(self, model: nn.Module, selector: str) -> Any:
        if selector != "meddling":
            return None
        self._meddle("select_regions")
        return blocks_plan(model)

    @torchkiln.hookimpl
    def wrap_distributed(
        self, model: nn.Module, strategy: str, compile_regions: Callable[[nn.Module], None]
    ) -> Any:
        if strategy != "meddling":
            return None
        compile_regions(model)
        self._meddle("wrap_distributed")
        return DistributedResult(wrapped=model, module=model, strategy="meddling")

    @torchkiln.hookimpl
    def prepare_group(self, config: Any) -> Any:
        if config.backend == "meddling":
            self._meddle("prepare_group")

    @torchkiln.hookimpl
    def compile_region(self, fn: Callable[..., Any], backend: str) -> Any:
        if backend != "meddling":
            return None
        self._meddle("compile_region")
        return torch.compile(fn, backend="eager")


OPTIONS = {"backend": "meddling", "regions": "meddling", "distributed": "meddling"}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
@pytest.mark.parametrize("hook", HOOKS)
def test_a_plugin_that_changes_the_model_and_fails(hook: str, mutation: str) -> None:
    model = ThreeGroups().eval()
    expected = model(inputs())
    before = Fingerprint.of(model)
    pm = torchkiln.PluginManager(entry_points=False, env={})
    pm.register(Meddling(model, hook, MUTATIONS[mutation]), name=PLUGIN)
    with pytest.raises(torchkiln.TorchkilnError) as raised:
        torchkiln.compile(model, plugins=pm, progress="off", **OPTIONS)
    message = str(raised.value)
    if not hook.startswith("declare_"):  # a failed declaration may leave its names unknown
        assert f"plugin {PLUGIN!r}" in message and hook in message
        assert getattr(raised.value, "plugin", None) == PLUGIN
    assert not torchkiln.is_compiled(model)
    if mutation == "parameter-values":  # cannot be put back: named, everything else is
        assert "wrote the values of mlps.0." in message and "reload them" in message
        assert raised.value.__cause__ is not None
        assert Fingerprint.of(model).differences(before) == ["tensor_bytes"]
        _first_parameter(model).data.div_(2)
    else:
        assert "wrote the values" not in message
        assert Fingerprint.of(model).differences(before) == []
    assert all(not m.training for m in model.modules())
    assert "TORCHKILN_TEST_MEDDLED" not in os.environ
    if hook == "select_regions":  # a retry with a good configuration works (one hook suffices)
        assert_retry_works(model, expected)
    else:
        torch.testing.assert_close(model(inputs()), expected)


class Strategy:
    """Plugin ``acme-dist`` serving strategy ``odd``, whose result is wrong as ``answer`` says."""

    def __init__(self, answer: Callable[[nn.Module, Callable[..., None]], Any]):
        self.answer = answer

    @torchkiln.hookimpl
    def declare_distributed(self) -> list[DistributedSpec]:
        return [DistributedSpec("odd")]

    @torchkiln.hookimpl
    def wrap_distributed(
        self, model: nn.Module, strategy: str, compile_regions: Callable[[nn.Module], None]
    ) -> Any:
        return self.answer(model, compile_regions) if strategy == "odd" else None


def _result(wrapped: Any, module: nn.Module) -> DistributedResult:
    return DistributedResult(wrapped=wrapped, module=module, strategy="odd")


def _once(model: nn.Module, compile_regions: Callable[..., None]) -> None:
    compile_regions(model)


ANSWERS: dict[str, Callable[[nn.Module, Callable[..., None]], Any]] = {
    "another-module": lambda m, c: (_once(m, c), _result(m, nn.Linear(1, 1)))[1],
    "wrapped-twice": lambda m, c: (_once(m, c), _result(nn.DataParallel(nn.DataParallel(m)), m))[1],
    "wrapper-of-another": lambda m, c: (_once(m, c), _result(nn.DataParallel(nn.Linear(1, 1)), m))[
        1
    ],
    "never-compiles": lambda m, c: _result(m, m),
    "compiles-twice": lambda m, c: (_once(m, c), _once(m, c), _result(m, m))[2],
    "returns-garbage": lambda m, c: (_once(m, c), 42)[1],
}


@pytest.mark.parametrize("answer", list(ANSWERS))
def test_a_strategys_faults_name_its_plugin(answer: str) -> None:
    pm = torchkiln.PluginManager(entry_points=False, env={})
    pm.register(Strategy(ANSWERS[answer]), name="acme-dist")
    model = ThreeGroups()
    before = Fingerprint.of(model)
    with pytest.raises(torchkiln.TorchkilnError, match=r"plugin 'acme-dist'"):
        torchkiln.compile(model, plugins=pm, backend="eager", distributed="odd", progress="off")
    assert Fingerprint.of(model).differences(before) == []
