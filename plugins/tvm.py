"""Built-in plugin: Apache TVM, backend ``tvm``, only where torch still ships its ``tvm``
dynamo backend.

torch's backend (``torch/_dynamo/backends/tvm.py``) imports ``tvm`` and ``tvm.relay`` on first
use; TVM releases that dropped Relay (0.20 and later) cannot run it. It compiles forward graphs
only, and reads three options.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torchkiln.plugin import (
    Availability,
    BackendSpec,
    CompileConfig,
    RegionGroup,
    compile_with_torch,
    hookimpl,
    probe_import,
    torch_knows,
)

NAME = "tvm"
INSTALL_HINT = "pip install apache-tvm (a release that still has tvm.relay, before 0.20)"
OPTIONS = ("scheduler", "trials", "opt_level")


def probe() -> Availability:
    if not torch_knows(NAME):
        import torch

        return Availability.no(f"torch {torch.__version__} no longer ships the tvm backend")
    availability = probe_import("tvm", INSTALL_HINT)
    if availability.available:
        availability = probe_import("tvm.relay", INSTALL_HINT)
    return availability


@hookimpl
def declare_backends() -> Sequence[BackendSpec]:
    spec = BackendSpec(
        NAME,
        "Apache TVM through torch's tvm backend (inference)",
        probe=probe,
        training=False,
        modes=(),
        options=OPTIONS,
        devices=("cpu", "cuda"),
    )
    return [spec]


@hookimpl
def compile_region(
    fn: Callable[..., Any], group: RegionGroup, config: CompileConfig, backend: str
) -> Callable[..., Any]:
    return compile_with_torch(fn, config, NAME)
