"""Bad distributed input, in one process: no process group, unknown strategy, DeepSpeed
missing, options an engine does not take; and unwrap / full_state_dict on plain modules."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

import torchkiln
from torchkiln.distributed import check_not_wrapped, full_state_dict, unwrap
from torchkiln.examples import toy

LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")


@pytest.fixture
def no_launcher(monkeypatch):
    for name in LAUNCHER_ENV:
        monkeypatch.delenv(name, raising=False)
    assert not torch.distributed.is_initialized()


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2", "deepspeed"])
def test_no_process_group_says_how_to_launch(no_launcher, strategy):
    pytest.importorskip("deepspeed") if strategy == "deepspeed" else None
    model = toy(depth=2)
    with pytest.raises(torchkiln.DistributedError) as caught:
        torchkiln.compile(model, backend="eager", distributed=strategy)
    message = str(caught.value)
    assert f"strategy {strategy!r}" in message
    assert "torchrun --nproc_per_node=2" in message
    assert "init_process_group" in message
    assert not torchkiln.is_compiled(model)  # refused before anything was touched


def test_unknown_strategy_lists_the_available_ones():
    with pytest.raises(torchkiln.ConfigError) as caught:
        torchkiln.compile(toy(depth=2), backend="eager", distributed="horovod")
    message = str(caught.value)
    assert "$.distributed.strategy" in message and "'horovod'" in message
    for name in ("ddp", "deepspeed", "fsdp2", "none"):
        assert name in message


def test_unknown_strategy_from_environment_names_the_variable(monkeypatch):
    monkeypatch.setenv("TORCHKILN_DISTRIBUTED_STRATEGY", "fsdp3")
    with pytest.raises(torchkiln.ConfigError) as caught:
        torchkiln.compile(toy(depth=2), backend="eager")
    assert "env:TORCHKILN_DISTRIBUTED_STRATEGY" in str(caught.value)
    assert "fsdp2" in str(caught.value)


def test_missing_deepspeed_says_how_to_install(monkeypatch, no_launcher):
    from torchkiln.plugins import deepspeed as plugin

    monkeypatch.setitem(sys.modules, "deepspeed", None)  # what an absent package looks like
    assert plugin.probe().available is False
    assert "pip install 'torchkiln[deepspeed]'" in plugin.probe().reason
    with pytest.raises(torchkiln.TorchkilnError) as caught:
        torchkiln.compile(toy(depth=2), backend="eager", distributed="deepspeed")
    assert "pip install 'torchkiln[deepspeed]'" in str(caught.value)


def test_declaring_and_probing_strategies_does_not_import_deepspeed():
    code = (
        "import sys, torchkiln\n"
        "specs = torchkiln.PluginManager().distributed_strategies()\n"
        "assert {'ddp', 'fsdp2', 'deepspeed'} <= set(specs), specs\n"
        "[d.spec.probe() for d in specs.values()]\n"
        "print('deepspeed' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"], out.stderr


def test_deepspeed_without_its_config_says_what_to_give(monkeypatch):
    pytest.importorskip("deepspeed")
    from torchkiln.configuration.config import CompileConfig
    from torchkiln.plugins.deepspeed import deepspeed_config

    with pytest.raises(torchkiln.DistributedError, match=r"distributed\.deepspeed\.config"):
        deepspeed_config(CompileConfig())


def test_unwrap_peels_torch_compile_and_returns_plain_modules():
    model = toy(depth=2)
    assert unwrap(model) is model
    assert unwrap(torch.compile(model, backend="eager")) is model
    with pytest.raises(TypeError, match="expects a module"):
        unwrap(object())


def test_full_state_dict_without_process_group_is_a_clean_cpu_copy():
    model = toy(depth=2)
    model.layers[0] = torch.compile(model.layers[0], backend="eager")  # adds _orig_mod. keys
    plain_keys = set(toy(depth=2).state_dict())
    state = full_state_dict(torch.compile(model, backend="eager"))
    assert set(state) == plain_keys
    fresh = toy(depth=2)
    fresh.load_state_dict(state, strict=True)
    state["embed.weight"].add_(1.0)  # a copy: the model is untouched
    assert not torch.equal(state["embed.weight"], model.embed.weight)


def test_compiled_module_given_to_a_strategy_is_refused():
    with pytest.raises(torchkiln.DistributedError, match=r"already wrapped by torch\.compile"):
        check_not_wrapped(torch.compile(nn.Linear(2, 2), backend="eager"), "ddp")
