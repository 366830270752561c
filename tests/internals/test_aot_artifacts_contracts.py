"""Contracts of :mod:`torchkiln._internals.aot_artifacts`: one test per function, each failing
with the private name it reads when a torch release changes it.

``aot_compile`` with the ``eager`` backend, saved and loaded again (a few seconds). torch 2.11
has no ``aot_compile``: the features that need it are refused there, and these tests skip.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch
from torch import nn

from torchkiln._internals import aot_artifacts, versions

pytestmark = pytest.mark.skipif(
    versions.feature_problem("precompiled artifacts") is not None,
    reason=str(versions.feature_problem("precompiled artifacts")),
)


def _whole(module: nn.Module, /, *args, **kwargs):
    return type(module).forward(module, *args, **kwargs)


def _aot(function: types.FunctionType, module: nn.Module, *args):
    torch._dynamo.reset()
    compiled = torch.compile(function, backend="eager", fullgraph=True, dynamic=False)
    return compiled.aot_compile(((module, *args), {}))


def test_loaded_guard_table_runs_a_saved_function_and_misses_another_shape(tmp_path: Path) -> None:
    """``AOTCompiledFunction._artifacts.guard_manager`` and ``AOTCompiledFunction.fn``."""
    torch.manual_seed(0)
    module, x = nn.Linear(3, 3), torch.randn(2, 3)
    path = tmp_path / "linear.bin"
    _aot(_whole, module, x).save_compiled_function(str(path))
    with path.open("rb") as handle:
        loaded = torch.compiler.load_compiled_function(handle, f_globals=_whole.__globals__)
    table = aot_artifacts.loaded_guard_table([loaded])
    assert len(table) == 1
    fits = {"module": module, "args": (torch.randn(2, 3),), "kwargs": {}}
    function = table.find(fits)
    assert function is not None, "the loaded guard_manager rejected the call it was saved for"
    with torch.no_grad():
        torch.testing.assert_close(function(module, x), module(x))
    other = {"module": module, "args": (torch.randn(2, 4),), "kwargs": {}}
    assert table.find(other) is None, "the loaded guard_manager passed another shape"
    (failed,) = table.first_failures(other)
    assert failed is not None and "args" in failed, failed


_PROBE_MODULE = "torchkiln_aot_probe"
_PROBE_SOURCE = """
import collections

def ordered(x):
    return collections.OrderedDict(out=x + 1)
"""


class _ReturnsOrdered(nn.Module):
    """Its output is built by a function of a module whose ``collections`` the traced
    function's globals do not hold: the compiled bytecode loads it through a global Dynamo
    installs."""

    def forward(self, x: torch.Tensor):
        return sys.modules[_PROBE_MODULE].ordered(x)


def test_installed_module_globals_names_the_module_dynamo_installed() -> None:
    """``AOTCompiledFunction._artifacts.runtime_env.external_refs`` and Dynamo's
    ``___module_<name>`` globals."""
    probe = types.ModuleType(_PROBE_MODULE)
    exec(_PROBE_SOURCE, probe.__dict__)
    sys.modules[_PROBE_MODULE] = probe
    try:
        aot = _aot(_whole, _ReturnsOrdered(), torch.randn(2))
    finally:
        del sys.modules[_PROBE_MODULE]
    found = aot_artifacts.installed_module_globals(aot, _whole.__globals__)
    assert "collections" in found.values(), (
        f"no ___module_ global among external_refs {aot._artifacts.runtime_env.external_refs}"
    )
    assert all(name.startswith("___module_") for name in found)
