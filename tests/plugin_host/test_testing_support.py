"""torchkiln.testing: the plugin-author fixtures and the backend-vs-eager check."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import torchkiln
from torchkiln import hookimpl
from torchkiln.plugin import BackendSpec
from torchkiln.plugin_host.default_manager import get_plugin_manager
from torchkiln.testing import (
    assert_backend_matches_eager,
    isolated_plugin_manager,
    register_plugin,
    small_inputs,
    small_model,
)


class TorchBackendPlugin:
    """Declares ``name``; compiles with torch's ``eager`` and lets ``wrap`` post-process."""

    def __init__(self, name, *, training=True, wrap=None, compile_nothing=False):
        self.name, self.training, self.wrap, self.compile_nothing = (
            name, training, wrap, compile_nothing,
        )  # fmt: skip

    @hookimpl
    def declare_backends(self):
        return [BackendSpec(self.name, training=self.training)]

    @hookimpl
    def compile_region(self, fn, group, config, backend):
        if self.compile_nothing:
            return fn
        compiled = torch.compile(fn, backend="eager")
        if self.wrap is None:
            return compiled
        return lambda module, *args, **kwargs: self.wrap(compiled(module, *args, **kwargs))


def _entry_point_plugin(tmp_path, monkeypatch):
    """An installed plugin, as pip would leave it: a module plus a dist-info with the entry point."""
    (tmp_path / "kiln_installed_plugin.py").write_text(
        "from torchkiln import hookimpl\n"
        "from torchkiln.plugin import BackendSpec\n"
        "@hookimpl\n"
        "def declare_backends():\n"
        "    return [BackendSpec('installed-backend')]\n"
    )
    dist_info = tmp_path / "kiln_installed_plugin-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: kiln-installed-plugin\nVersion: 1.0\n"
    )
    (dist_info / "entry_points.txt").write_text("[torchkiln]\ninstalled = kiln_installed_plugin\n")
    monkeypatch.syspath_prepend(str(tmp_path))


def test_fixture_manager_has_the_builtins_and_ignores_installed_plugins(
    torchkiln_plugin_manager, tmp_path, monkeypatch
):
    _entry_point_plugin(tmp_path, monkeypatch)
    monkeypatch.setenv("TORCHKILN_DISABLED_PLUGINS", "torchkiln.xla")
    default = torchkiln.PluginManager()
    assert "installed-backend" in default.backends()  # the entry point really is visible
    assert "xla" not in default.backends(include_torch=False)
    isolated = torchkiln_plugin_manager.backends(include_torch=False)
    assert "installed-backend" not in isolated
    assert {"inductor", "eager", "xla", "hpu", "neuron"} <= set(isolated)
    sys.modules.pop("kiln_installed_plugin", None)


def test_register_plugin_registers_for_the_block_only(torchkiln_plugin_manager):
    plugin = TorchBackendPlugin("mine")
    with register_plugin(torchkiln_plugin_manager, plugin, name="mine-plugin") as manager:
        assert manager is torchkiln_plugin_manager
        assert manager.backends()["mine"].plugin == "mine-plugin"
    assert "mine" not in torchkiln_plugin_manager.backends()
    assert torchkiln_plugin_manager.get_plugin("mine-plugin") is None


def test_register_plugin_unregisters_after_an_error_and_defaults_to_the_process_manager():
    plugin = TorchBackendPlugin("mine-global")
    with pytest.raises(KeyError), register_plugin(None, plugin) as manager:
        assert manager is get_plugin_manager()
        assert "mine-global" in manager.backends()
        raise KeyError("boom")
    assert "mine-global" not in get_plugin_manager().backends()


def test_matching_backend_passes_and_reports_what_it_checked():
    check = assert_backend_matches_eager("aot_eager", plugins=isolated_plugin_manager())
    assert check.backend == "aot_eager"
    assert check.graphs >= 1
    assert check.max_abs_diff == 0.0
    assert check.gradients_checked == len(list(small_model().parameters())) == 14


def test_the_callers_model_is_left_untouched():
    model = small_model()
    assert_backend_matches_eager(
        "aot_eager", model, small_inputs(), plugins=isolated_plugin_manager()
    )
    assert not torchkiln.is_compiled(model)
    assert all(p.grad is None for p in model.parameters())


def test_wrong_outputs_fail_naming_the_output():
    plugin = TorchBackendPlugin("off-by-a-bit", wrap=lambda out: out + 1e-2)
    with pytest.raises(AssertionError, match="output 0"):
        assert_backend_matches_eager("off-by-a-bit", plugins=[plugin])


def test_wrong_gradients_fail_naming_the_parameter():
    def half_gradient(out):
        return out.detach() + 0.5 * (out - out.detach())  # same values, half the gradient

    plugin = TorchBackendPlugin("half-grad", wrap=half_gradient)
    with pytest.raises(AssertionError, match=r"gradient of blocks\.0\."):
        assert_backend_matches_eager("half-grad", plugins=[plugin])
    # An inference-only backend is not asked for gradients.
    inference = TorchBackendPlugin("half-grad-inference", training=False, wrap=half_gradient)
    assert (
        assert_backend_matches_eager("half-grad-inference", plugins=[inference]).gradients_checked
        == 0
    )


def test_a_backend_that_compiles_nothing_fails():
    plugin = TorchBackendPlugin("lazy-vendor", compile_nothing=True)
    with pytest.raises(AssertionError, match="'lazy-vendor' compiled no graph"):
        assert_backend_matches_eager("lazy-vendor", plugins=[plugin])


def test_unknown_backend_names_the_registered_ones():
    with pytest.raises(AssertionError, match=r"'nope' is not registered; registered: .*aot_eager"):
        assert_backend_matches_eager("nope", plugins=isolated_plugin_manager())


def test_keyword_inputs_and_tuple_outputs():
    class Pair(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = small_model(depth=2)

        def forward(self, x, *, scale):
            y = self.inner(x)
            return y, y * scale

    check = assert_backend_matches_eager(
        "eager", Pair(), {"x": small_inputs(), "scale": 2.0}, plugins=isolated_plugin_manager()
    )
    assert check.gradients_checked == 14


def test_importing_the_pytest_plugin_imports_no_vendor_library():
    code = (
        "import sys, torchkiln.testing\n"
        "vendors = ('torch_xla', 'habana_frameworks', 'torch_neuronx', 'torch_tensorrt', 'tvm',"
        " 'openvino', 'deepspeed', 'transformers')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in vendors))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
