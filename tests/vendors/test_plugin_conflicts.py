"""Bad input from plugins and users around backend names: a name declared twice, a plugin whose
hook raises, an unknown backend name."""

from __future__ import annotations

import pytest
import torch

import torchkiln
from torchkiln import ConfigError, PluginError, RegionCompileError, hookimpl
from torchkiln.plugin import BackendSpec
from torchkiln.testing import isolated_plugin_manager, small_inputs, small_model


class VendorXla:
    """A third-party plugin that declares ``xla`` too, compiling with torch's ``eager``."""

    def __init__(self) -> None:
        self.compiled_groups: list[str] = []

    @hookimpl
    def declare_backends(self):
        return [BackendSpec("xla", "someone else's XLA")]

    @hookimpl
    def compile_region(self, fn, group, config, backend):
        if backend != "xla":
            return None
        self.compiled_groups.append(group.name)
        return torch.compile(fn, backend="eager")


def test_duplicate_backend_name_is_reported_with_both_plugins_and_the_later_one_wins():
    manager = isolated_plugin_manager()
    vendor = VendorXla()
    manager.register(vendor, name="vendor-xla")
    with pytest.warns(RuntimeWarning) as warned:
        backends = manager.backends()
    message = str(warned[0].message)
    assert "'xla' is declared by both plugin 'vendor-xla' and plugin 'torchkiln.xla'" in message
    assert "using 'vendor-xla'" in message
    assert backends["xla"].plugin == "vendor-xla"
    # The winner's probe is the one asked (it needs no torch_xla) and its compile_region runs
    # first, so the built-in never sees the region.
    assert backends["xla"].spec.probe().available
    model = small_model()
    expected = small_model()(small_inputs())
    torchkiln.compile(model, backend="xla", plugins=manager)
    torch.testing.assert_close(model(small_inputs()), expected)
    assert vendor.compiled_groups == ["TinyBlock"]


def test_plugin_whose_declaration_hook_raises_is_quarantined_and_named():
    class Raising:
        @hookimpl
        def declare_backends(self):
            raise ValueError("bad spec table")

    manager = isolated_plugin_manager()
    manager.register(Raising(), name="raising-vendor")
    model = small_model()
    expected = small_model()(small_inputs())
    with pytest.warns(RuntimeWarning) as warned:
        torchkiln.compile(model, backend="eager", plugins=manager)  # others unaffected
    torch.testing.assert_close(model(small_inputs()), expected)
    message = str(warned[0].message)
    assert "plugin 'raising-vendor' was quarantined" in message
    assert "its declare_backends() raised ValueError: bad spec table" in message


def test_plugin_whose_compile_region_raises_fails_with_its_error_and_the_region():
    class Crashing:
        @hookimpl
        def declare_backends(self):
            return [BackendSpec("crashy")]

        @hookimpl
        def compile_region(self, fn, group, config, backend):
            if backend == "crashy":
                raise RuntimeError("vendor compiler crashed")

    manager = isolated_plugin_manager()
    manager.register(Crashing(), name="crashing-vendor")
    with pytest.raises(RegionCompileError) as raised:
        torchkiln.compile(small_model(), backend="crashy", plugins=manager)
    message = str(raised.value)
    assert "'blocks.0'" in message
    assert "plugin 'crashing-vendor'" in message
    assert "RuntimeError: vendor compiler crashed" in message


def test_unknown_backend_lists_registered_and_torch_known_names():
    with pytest.raises(ConfigError) as raised:
        torchkiln.compile(small_model(), backend="xlaa", plugins=isolated_plugin_manager())
    message = str(raised.value)
    assert "'xlaa' is not a registered backend (did you mean 'xla'?)" in message
    registered = message.split("registered by plugins: ")[1].split(";")[0].split(", ")
    assert {"xla", "xla_inference", "hpu", "neuron", "tensorrt", "tvm", "eager"} <= set(registered)
    known_to_torch = message.split("known to torch: ")[1].split(", ")
    assert "aot_ts" in known_to_torch
    assert "xla" not in known_to_torch


def test_plugin_whose_resolve_compile_config_raises_is_named():
    class Raising:
        @hookimpl
        def resolve_compile_config(self, config, sources):
            raise KeyError("no such preset")

    manager = isolated_plugin_manager()
    manager.register(Raising(), name="preset-plugin")
    with pytest.raises(
        PluginError, match=r"plugin 'preset-plugin' raised in resolve_compile_config\(\)"
    ):
        torchkiln.compile(small_model(), backend="eager", plugins=manager)
