"""Built-in plugin: the core backends ``inductor``, ``eager``, ``aot_eager``, ``cudagraphs``
and ``no``, each carrying its compile (``BackendSpec.compile``). Any other name ``torch._dynamo.list_backends()`` knows works too (compiled by
torchkiln with ``torch.compile`` itself)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torchkiln.plugin import (
    Availability,
    BackendSpec,
    CompileConfig,
    RegionGroup,
    compile_with_torch,
    hookimpl,
)

INDUCTOR_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def _compile(fn: Callable[..., Any], group: RegionGroup, config: CompileConfig) -> Any:
    return compile_with_torch(fn, config)


def _cuda_available() -> Availability:
    if torch.cuda.is_available():
        return Availability.yes()
    return Availability.no("cudagraphs needs a CUDA device and torch.cuda.is_available() is False")


BACKENDS = (
    BackendSpec(
        "inductor",
        "TorchInductor: Triton on GPU, C++/OpenMP on CPU",
        modes=INDUCTOR_MODES,
        precompile=True,
        compile=_compile,
    ),
    BackendSpec(
        "eager",
        "Dynamo capture only, runs the graph eagerly (debugging)",
        modes=(),
        compile=_compile,
    ),
    BackendSpec(
        "aot_eager",
        "Dynamo + AOTAutograd, runs eagerly (debugging, fast tests)",
        modes=(),
        precompile=True,
        compile=_compile,
    ),
    BackendSpec(
        "cudagraphs",
        "CUDA graphs without inductor",
        probe=_cuda_available,
        modes=(),
        devices=("cuda",),
        compile=_compile,
    ),
    BackendSpec("no", "compilation off: the model runs eagerly", modes=(), compile=_compile),
)


@hookimpl
def declare_backends() -> list[BackendSpec]:
    return list(BACKENDS)
