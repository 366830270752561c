"""Contracts of ``torchkiln._internals.tvm_backend``: which TVM frontend torch's own ``tvm``
backend compiles through, read from its code, on this torch (no ``tvm`` installed or imported).
"""

from __future__ import annotations

import functools
import sys

import torch
from torch._dynamo.backends import registry

from torchkiln._internals import tvm_backend
from torchkiln._internals.versions import release_tuple


def expected_frontend() -> str:
    """torch moved its backend from Relay to Relax in 2.14 (the version is the expected value
    only; the adapter reads torch's code)."""
    release = release_tuple(torch.__version__)
    assert release is not None, torch.__version__
    return "relax" if release >= (2, 14) else "relay"


def test_imported_names() -> None:
    def backend(gm, example_inputs):
        import tvm  # noqa: F401
        from tvm.contrib import graph_executor  # noqa: F401

        def nested():
            from tvm.relax.frontend.torch import relax_dynamo  # noqa: F401

        return nested

    @functools.wraps(backend)
    def wrapper(*args):
        return backend(*args)

    assert tvm_backend.imported_names(wrapper) == {
        "tvm",
        "tvm.contrib",
        "tvm.contrib.graph_executor",
        "tvm.relax.frontend.torch",
        "tvm.relax.frontend.torch.relax_dynamo",
    }
    assert tvm_backend.imported_names(len) == frozenset()


def tvm_modules() -> set[str]:
    return {name for name in sys.modules if name.split(".", 1)[0] == "tvm"}


def test_torch_tvm_frontend() -> None:
    before = tvm_modules()
    assert tvm_backend.torch_tvm_frontend() == expected_frontend()
    assert tvm_modules() == before  # torch's code is read, not run: no tvm imported


def test_torch_tvm_frontend_reads_the_backend_torch_registered(monkeypatch) -> None:
    registry._lazy_import()

    def importing_no_tvm(gm, example_inputs):
        return gm.forward

    importing_no_tvm._tags = ()  # where torch before 2.15 keeps a backend's tags
    monkeypatch.setitem(registry._COMPILER_FNS, "tvm", importing_no_tvm)
    assert tvm_backend.torch_tvm_frontend() == "unknown"
    monkeypatch.delitem(registry._BACKENDS, "tvm")
    assert tvm_backend.torch_tvm_frontend() is None
