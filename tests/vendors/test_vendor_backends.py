"""The accelerator backend plugins (xla, hpu, neuron, tensorrt, tvm) against stand-in vendor
libraries (``standins/``): the plugins' real probes, imports, torch registrations and option
paths run; only the vendor library is fake. Without the stand-ins, the "not installed" paths run.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch._dynamo.backends import registry

import torchkiln
from torchkiln import ConfigError
from torchkiln._internals import tvm_backend
from torchkiln._internals.versions import torch_release
from torchkiln.plugins import hpu, neuron, tensorrt, tvm, xla
from torchkiln.testing import (
    assert_backend_matches_eager,
    isolated_plugin_manager,
    small_inputs,
    small_model,
)

STANDINS = Path(__file__).parent / "standins"
VENDOR_PACKAGES = ("torch_xla", "habana_frameworks", "torch_neuronx", "torch_tensorrt", "tvm")

VENDOR_PLUGINS = (xla, hpu, neuron, tensorrt, tvm)


def declared(name: str):
    return isolated_plugin_manager().backends()[name]


# --- no vendor library installed ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("backend", "reason"),
    [
        ("xla", "torch_xla is not installed: pip install torch_xla"),
        ("xla_inference", "torch_xla is not installed: pip install torch_xla"),
        ("openxla", "torch_xla is not installed: pip install torch_xla"),
        ("hpu", "habana_frameworks is not installed: install Intel Gaudi's PyTorch packages"),
        ("neuron", "torch_neuronx is not installed: pip install torch-neuronx"),
        ("tensorrt", "torch_tensorrt is not installed: pip install torch-tensorrt"),
        ("tvm", "tvm is not installed: pip install apache-tvm"),
    ],
)
def test_probe_says_what_is_missing_and_how_to_install_it(no_vendors, backend, reason):
    entry = declared(backend)
    availability = entry.spec.probe()
    assert entry.plugin.startswith("torchkiln.")
    assert availability.available is False
    assert reason in availability.reason


def test_unavailable_backend_fails_when_configured_not_when_called(no_vendors):
    model = small_model()
    with pytest.raises(ConfigError) as raised:
        torchkiln.compile(model, backend="xla", plugins=isolated_plugin_manager())
    message = str(raised.value)
    assert "$.backend" in message
    assert "torch_xla is not installed: pip install torch_xla" in message
    assert not torchkiln.is_compiled(model)
    assert "forward" not in model.blocks[0].__dict__


def test_probe_reports_a_broken_vendor_install_instead_of_raising(tmp_path, monkeypatch):
    package = tmp_path / "torch_xla"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('libtpu.so: cannot open')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    availability = xla.probe()
    assert availability.available is False
    assert "importing torch_xla.core.dynamo_bridge failed" in availability.reason
    assert "RuntimeError: libtpu.so: cannot open" in availability.reason
    assert "torch_xla" not in sys.modules


def test_importing_and_listing_imports_no_vendor_library():
    """``import torchkiln`` and reading the backend registry import no vendor module, even with
    every vendor importable; only probing (or compiling) does."""
    script = textwrap.dedent(
        f"""
        import sys
        import torchkiln
        manager = torchkiln.PluginManager(entry_points=False, env={{}})
        names = manager.backends()
        assert {{"xla", "hpu", "neuron", "tensorrt", "tvm"}} <= set(names), sorted(names)
        vendors = {VENDOR_PACKAGES!r}
        print(sorted(m for m in sys.modules if m.split(".")[0] in vendors))
        names["hpu"].spec.probe()
        print(sorted(m for m in sys.modules if m.split(".")[0] in vendors))
        """
    )
    env = {"PYTHONPATH": str(STANDINS), "PATH": "/usr/bin:/bin", "PT_HPU_LAZY_MODE": "0"}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr
    before_probe, after_probe = result.stdout.strip().splitlines()
    assert before_probe == "[]"
    assert "habana_frameworks.torch.core" in after_probe


@pytest.mark.parametrize("plugin", VENDOR_PLUGINS, ids=lambda p: p.__name__.rsplit(".", 1)[-1])
def test_a_vendor_backend_compiles_only_its_own_backends(plugin, monkeypatch):
    """Each vendor backend carries its compile (``BackendSpec.compile``) instead of a
    ``compile_region`` hook: configuring another backend never calls it."""
    called = []

    def compile_group(fn, group, config, **bound):
        called.append(config.backend)
        raise AssertionError("called for a backend this plugin did not declare")

    monkeypatch.setattr(plugin, "compile_group", compile_group)
    assert not hasattr(plugin, "compile_region")
    pm = isolated_plugin_manager()
    mine = [
        d
        for d in pm.backends().values()
        if d.plugin == "torchkiln." + plugin.__name__.rsplit(".", 1)[-1]
    ]
    assert mine and all(d.spec.compile is not None for d in mine)
    model = small_model()
    torchkiln.compile(model, backend="eager", plugins=pm)
    model(small_inputs())
    assert called == []


# --- xla ---------------------------------------------------------------------------------------


def test_xla_trains_through_torch_openxla_backend_and_torch_xla_bridge(standins):
    bridge = importlib.import_module("torch_xla.core.dynamo_bridge")
    check = assert_backend_matches_eager("xla", plugins=isolated_plugin_manager())
    assert check.graphs >= 1
    assert check.gradients_checked == 14  # every parameter of the small model
    # AOTAutograd hands the forward and the backward graph of the block to torch_xla.
    assert bridge.CALLS["graphs"] >= 2
    assert bridge.CALLS["runs"] >= 2


def test_xla_inference_compiles_forward_only_through_openxla_eval(standins):
    bridge = importlib.import_module("torch_xla.core.dynamo_bridge")
    spec = declared("xla_inference").spec
    assert spec.training is False
    check = assert_backend_matches_eager("xla_inference", plugins=isolated_plugin_manager())
    assert check.gradients_checked == 0
    assert bridge.CALLS["graphs"] >= 1


def test_torch_name_openxla_is_probed_like_xla(no_vendors):
    entry = declared("openxla")
    assert entry.plugin == "torchkiln.xla"
    assert "torch_xla is not installed" in entry.spec.probe().reason


def test_xla_rejects_mode_and_options_it_would_ignore(standins):
    manager = isolated_plugin_manager()
    with pytest.raises(ConfigError) as raised:
        torchkiln.compile(small_model(), backend="xla", mode="max-autotune", plugins=manager)
    assert "'max-autotune' is not a mode backend 'xla' accepts" in str(raised.value)
    with pytest.raises(ConfigError) as raised:
        torchkiln.compile(small_model(), backend="xla", options={"fuse": True}, plugins=manager)
    assert "does not accept option 'fuse'" in str(raised.value)


# --- hpu ---------------------------------------------------------------------------------------


def test_hpu_compiles_with_hpu_backend_registered_by_habana_import(standins, monkeypatch):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    assert "hpu_backend" not in torch._dynamo.list_backends(exclude_tags=())
    check = assert_backend_matches_eager(
        "hpu", plugins=isolated_plugin_manager(), options={"keep_input_mutations": True}
    )
    core = importlib.import_module("habana_frameworks.torch.core")
    assert "hpu_backend" in torch._dynamo.list_backends(exclude_tags=())
    assert check.gradients_checked == 14
    assert core.CALLS["graphs"] >= 2  # forward and backward
    assert core.CALLS["options"][0] == {"keep_input_mutations": True}


@pytest.mark.parametrize("value", ["1", "true"])
def test_hpu_in_lazy_mode_is_refused_with_the_fix(standins, monkeypatch, value):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", value)
    availability = hpu.probe()
    assert availability.available is False
    assert f"PT_HPU_LAZY_MODE={value!r} selects Gaudi's lazy mode" in availability.reason
    assert "PT_HPU_LAZY_MODE=0" in availability.reason
    # Refused before importing: the import would fix the mode for the whole process.
    assert "habana_frameworks" not in sys.modules
    with pytest.raises(ConfigError, match="start the process with PT_HPU_LAZY_MODE=0"):
        torchkiln.compile(small_model(), backend="hpu", plugins=isolated_plugin_manager())


def test_hpu_lazy_by_default_release_is_detected_after_import(standins, monkeypatch):
    monkeypatch.delenv("PT_HPU_LAZY_MODE", raising=False)
    internal = importlib.import_module("habana_frameworks.torch.utils.internal")
    monkeypatch.setattr(internal, "is_lazy", lambda: True)
    availability = hpu.probe()
    assert availability.available is False
    assert "PT_HPU_LAZY_MODE unset defaults to 1 in this release" in availability.reason


# --- neuron ------------------------------------------------------------------------------------


def test_neuron_backend_comes_from_torch_entry_point_and_trains(standins):
    # torch knows the name from torch-neuronx's entry point, but has not loaded it yet.
    assert "neuron" in torch._dynamo.list_backends(exclude_tags=())
    assert "neuron" not in registry._COMPILER_FNS
    check = assert_backend_matches_eager(
        "neuron", plugins=isolated_plugin_manager(), mode="default"
    )
    backend = importlib.import_module("torch_neuronx.neuron_dynamo_backend.backend")
    assert check.gradients_checked == 14
    assert backend.CALLS["graphs"] >= 2
    assert set(backend.CALLS["modes"]) == {None}  # torch passes no mode for "default"


def test_neuron_rejects_other_modes_and_dynamic_true_at_configuration(standins):
    manager = isolated_plugin_manager()
    with pytest.raises(ConfigError) as raised:
        torchkiln.compile(small_model(), backend="neuron", mode="reduce-overhead", plugins=manager)
    assert "'reduce-overhead' is not a mode backend 'neuron' accepts; allowed: default" in str(
        raised.value
    )
    with pytest.raises(ConfigError) as raised:
        torchkiln.compile(small_model(), backend="neuron", dynamic=True, plugins=manager)
    assert "$.dynamic" in str(raised.value)
    assert "the neuron backend rejects dynamic=True" in str(raised.value)


def test_neuron_without_the_entry_point_says_which_torch_neuronx_it_needs(standins):
    registry._BACKENDS.pop("neuron")  # the XLA-based torch-neuronx registers no backend
    availability = neuron.probe()
    assert availability.available is False
    assert "torch_neuronx is installed but registers no 'neuron' torch.compile backend" in (
        availability.reason
    )


# --- tensorrt ----------------------------------------------------------------------------------


def test_tensorrt_passes_its_options_through(standins):
    options = {"min_block_size": 1, "enabled_precisions": {torch.float32}}
    check = assert_backend_matches_eager(
        "tensorrt", plugins=isolated_plugin_manager(), options=options
    )
    trt = importlib.import_module("torch_tensorrt")
    assert check.gradients_checked == 0  # inference only
    assert trt.CALLS["graphs"] >= 1
    assert trt.CALLS["options"][0] == options


def test_tensorrt_rejects_unknown_options_and_any_mode(standins):
    manager = isolated_plugin_manager()
    with pytest.raises(ConfigError) as raised:
        torchkiln.compile(
            small_model(), backend="tensorrt", options={"min_blok_size": 1}, plugins=manager
        )
    message = str(raised.value)
    assert "$.options.min_blok_size" in message
    assert "does not accept option 'min_blok_size'" in message
    assert "min_block_size" in message  # the allowed ones are listed
    with pytest.raises(ConfigError, match="allowed: none"):
        torchkiln.compile(small_model(), backend="tensorrt", mode="max-autotune", plugins=manager)


def test_tensorrt_uses_the_older_torch_tensorrt_name_when_that_is_all_there_is(standins):
    importlib.import_module("torch_tensorrt")
    assert tensorrt.registered_name() == "tensorrt"
    registry._BACKENDS.pop("tensorrt")
    assert tensorrt.registered_name() == "torch_tensorrt"


# --- tvm ---------------------------------------------------------------------------------------
# torch's tvm backend compiles through TVM Relay up to torch 2.13 and through Relax from 2.14 on;
# the plugin asks torch's backend which (torchkiln._internals.tvm_backend), and so do these tests.


def test_tvm_runs_torch_tvm_backend_with_its_options(standins):
    frontend = tvm_backend.torch_tvm_frontend()
    pipeline = object()  # stands for a TVM pass, tvm.relax.get_pipeline(...)
    options = {"opt_level": 2} if frontend == "relay" else {"pipeline": pipeline}
    check = assert_backend_matches_eager("tvm", plugins=isolated_plugin_manager(), options=options)
    tvm_module = importlib.import_module("tvm")
    assert check.gradients_checked == 0
    if frontend == "relay":
        assert tvm_module.CALLS["builds"] >= 1
        assert tvm_module.CALLS["opt_levels"][0] == 2
        assert tvm_module.CALLS["pipelines"] == []
    else:
        assert frontend == "relax"
        assert tvm_module.CALLS["pipelines"]
        assert all(seen is pipeline for seen in tvm_module.CALLS["pipelines"])
        assert tvm_module.CALLS["builds"] == 0
    assert tvm_module.CALLS["runs"] >= 1


@pytest.mark.parametrize(
    ("frontend", "packages", "missing"),
    [
        ("relay", [], "tvm.relay"),
        ("relax", [], "tvm.relax"),
        ("relax", ["relax"], "tvm.relax.frontend"),
    ],
    ids=["relay", "relax", "relax-without-torch-frontend"],
)
def test_tvm_without_the_frontend_torch_uses_is_refused(
    tmp_path, monkeypatch, no_vendors, frontend, packages, missing
):
    if tvm_backend.torch_tvm_frontend() != frontend:
        pytest.skip(f"torch {torch.__version__}'s tvm backend does not use {frontend}")
    for package in ["tvm", *(f"tvm/{name}" for name in packages)]:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("__version__ = '0.21.0'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        availability = tvm.probe()
    finally:
        for name in [n for n in sys.modules if n.split(".", 1)[0] == "tvm"]:
            del sys.modules[name]
    assert availability.available is False
    reason = availability.reason
    assert (
        f"torch {torch_release()}'s tvm backend compiles through TVM {frontend.capitalize()}:"
        in reason
    )
    assert f"the installed tvm has no {missing}" in reason
    assert tvm.INSTALL_HINTS[frontend] in reason


@pytest.mark.parametrize(
    ("frontend", "other_option", "allowed"),
    [("relax", "opt_level", "pipeline"), ("relay", "pipeline", "scheduler, trials, opt_level")],
)
def test_tvm_refuses_the_other_frontends_options(standins, frontend, other_option, allowed):
    if tvm_backend.torch_tvm_frontend() != frontend:
        pytest.skip(f"torch {torch.__version__}'s tvm backend does not use {frontend}")
    model = small_model()
    with pytest.raises(ConfigError) as raised:
        torchkiln.compile(
            model, backend="tvm", options={other_option: 2}, plugins=isolated_plugin_manager()
        )
    message = str(raised.value)
    assert f"$.options.{other_option}" in message
    assert f"does not accept option '{other_option}'" in message
    assert f"allowed: {allowed}" in message
    assert not torchkiln.is_compiled(model)


def test_tvm_where_torch_no_longer_ships_it(standins):
    registry._BACKENDS.pop("tvm")
    assert tvm_backend.torch_tvm_frontend() is None
    availability = tvm.probe()
    assert availability.available is False
    assert "no longer ships the tvm backend" in availability.reason
