"""Built-in plugin: Apache TVM, backend ``tvm``, through torch's own ``tvm`` dynamo backend, where
this torch ships one.

torch's backend (``torch/_dynamo/backends/tvm.py``) compiles forward graphs only, and its TVM
frontend depends on the torch release: **Relay** (torch up to 2.13; options ``scheduler``,
``trials``, ``opt_level``) or **Relax** (torch 2.14 on; one option, ``pipeline``). The plugin
reads which one from torch's backend code
(:func:`torchkiln._internals.tvm_backend.torch_tvm_frontend`), not from version numbers. The
probe imports the module that frontend needs, and only the frontend's options are declared,
so the other frontend's options are refused when the configuration is read.
docs/plugins/vendors.md ("TVM") says which TVM releases each frontend needs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torchkiln._internals import tvm_backend
from torchkiln._internals.versions import torch_release
from torchkiln.plugin import (
    Availability,
    BackendSpec,
    CompileConfig,
    RegionGroup,
    compile_with_torch,
    hookimpl,
    probe_import,
)

NAME = "tvm"
FRONTEND_MODULES = {"relay": "tvm.relay", "relax": "tvm.relax.frontend.torch"}
"""The module torch's backend imports for each frontend, which the probe imports."""
INSTALL_HINTS = {
    "relay": "pip install apache-tvm (a release that still has tvm.relay, before 0.20)",
    "relax": "pip install apache-tvm (a release with tvm.relax.frontend.torch, Relax's PyTorch "
    "frontend)",
}
OPTIONS = {"relay": ("scheduler", "trials", "opt_level"), "relax": ("pipeline",)}
"""The options torch's backend reads, per frontend."""


def probe() -> Availability:
    frontend = tvm_backend.torch_tvm_frontend()
    if frontend is None:
        return Availability.no(f"torch {torch_release()} no longer ships the tvm backend")
    if frontend not in FRONTEND_MODULES:
        return Availability.no(
            f"torch {torch_release()}'s tvm backend imports neither tvm.relay nor "
            "tvm.relax.frontend.torch; this torchkiln does not know its TVM frontend"
        )
    module, hint = FRONTEND_MODULES[frontend], INSTALL_HINTS[frontend]
    availability = probe_import("tvm", hint)
    if availability.available:
        availability = probe_import(module, hint)
    if availability.available:
        return availability
    return Availability.no(
        f"torch {torch_release()}'s tvm backend compiles through TVM {frontend.capitalize()}: "
        f"{availability.reason}"
    )


@hookimpl
def declare_backends() -> Sequence[BackendSpec]:
    frontend = tvm_backend.torch_tvm_frontend()
    described = f" {frontend.capitalize()}" if frontend in FRONTEND_MODULES else ""
    spec = BackendSpec(
        NAME,
        f"Apache TVM{described} through torch's tvm backend (inference)",
        probe=probe,
        training=False,
        modes=(),
        # No tvm backend, or one of unknown frontend: the probe refuses it, with the reason.
        options=OPTIONS.get(frontend or "", ()),
        devices=("cpu", "cuda"),
        compile=compile_group,
    )
    return [spec]


def compile_group(
    fn: Callable[..., Any], group: RegionGroup, config: CompileConfig
) -> Callable[..., Any]:
    """The ``tvm`` backend's compile of one region group (``BackendSpec.compile``)."""
    return compile_with_torch(fn, config, NAME)
