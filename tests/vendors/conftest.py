"""Fixtures for the vendor backend tests: stand-in vendor libraries on ``sys.path``.

Each test that uses :func:`standins` sees the fakes in ``standins/`` importable (and the
stand-in torch-neuronx's ``torch_dynamo_backends`` entry point discovered), and leaves nothing
behind: the vendor modules are dropped from ``sys.modules`` and torch's backend registry is put
back as it was.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch._dynamo
from torch._dynamo.backends import registry

STANDINS = Path(__file__).parent / "standins"
VENDOR_PACKAGES = ("torch_xla", "habana_frameworks", "torch_neuronx", "torch_tensorrt", "tvm")


def _drop_vendor_modules() -> None:
    for name in [n for n in sys.modules if n.split(".", 1)[0] in VENDOR_PACKAGES]:
        del sys.modules[name]


@pytest.fixture
def standins(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The stand-in vendor libraries, importable for one test."""
    real = [p for p in VENDOR_PACKAGES if importlib.util.find_spec(p) is not None]
    if real:
        pytest.skip(
            f"real vendor libraries installed here ({', '.join(real)}); stand-ins would clash"
        )
    registry._lazy_import()  # torch's own backends registered before the snapshot
    backends, compilers = dict(registry._BACKENDS), dict(registry._COMPILER_FNS)
    monkeypatch.syspath_prepend(str(STANDINS))
    # As if torch-neuronx had been installed when the process started: rediscover entry points.
    registry._discover_entrypoint_backends.cache_clear()
    registry._discover_entrypoint_backends()
    try:
        yield STANDINS
    finally:
        _drop_vendor_modules()
        registry._BACKENDS.clear()
        registry._BACKENDS.update(backends)
        registry._COMPILER_FNS.clear()
        registry._COMPILER_FNS.update(compilers)
        torch._dynamo.reset()


@pytest.fixture
def no_vendors() -> None:
    """Skip where a real vendor library is installed (the 'not installed' paths can't run)."""
    real = [p for p in VENDOR_PACKAGES if importlib.util.find_spec(p) is not None]
    if real:
        pytest.skip(f"real vendor libraries installed here: {', '.join(real)}")
