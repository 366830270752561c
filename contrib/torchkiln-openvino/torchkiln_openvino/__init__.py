"""torchkiln plugin: backend ``openvino``, on OpenVINO's own ``torch.compile`` backend.

``import openvino.torch`` registers OpenVINO's ``openvino`` dynamo backend, which converts each
FX graph to an OpenVINO model and runs it on an OpenVINO device (CPU by default). This plugin
declares it to torchkiln with a probe, the option keys OpenVINO reads, and the import.
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch

from torchkiln.plugin import Availability, BackendSpec, compile_with_torch, hookimpl

__version__ = "0.1.0"

NAME = "openvino"
INSTALL_HINT = "pip install openvino"
OPTIONS = (
    "device", "config", "model_caching", "cache_dir", "aot_autograd", "decompositions",
    "disabled_ops",
)  # fmt: skip
"""The option keys OpenVINO's backend reads (openvino/frontend/pytorch/torchdynamo)."""


def probe() -> Availability:
    # find_spec, not import: importing openvino.torch changes a torch._dynamo flag (below),
    # and merely listing plugins must not do that.
    try:
        found = importlib.util.find_spec("openvino.torch") is not None
    except Exception as error:  # a broken openvino install can raise anything
        return Availability.no(f"openvino is broken: {type(error).__name__}: {error}")
    return (
        Availability.yes()
        if found
        else Availability.no(f"openvino is not installed: {INSTALL_HINT}")
    )


def register_openvino_backend() -> None:
    """Import ``openvino.torch`` (it registers the backend) without keeping its global change.

    On import OpenVINO sets ``torch._dynamo.config.inline_inbuilt_nn_modules = False`` for the
    whole process. torchkiln passes each block to its compiled function as an argument, and
    with that flag off Dynamo would specialise on each block object and recompile per block, so
    the flag is put back as it was; OpenVINO then receives the weights as graph inputs.
    """
    with warnings.catch_warnings():  # torch 2.13 deprecates the flag (always on there)
        warnings.simplefilter("ignore", FutureWarning)
        inline = torch._dynamo.config.inline_inbuilt_nn_modules
        try:
            import openvino.torch  # noqa: F401
        finally:
            torch._dynamo.config.inline_inbuilt_nn_modules = inline


@hookimpl
def declare_backends() -> Sequence[BackendSpec]:
    return [
        BackendSpec(
            NAME,
            "OpenVINO's torch.compile backend (Intel CPU, GPU, NPU; inference)",
            probe=probe,
            training=False,
            modes=(),
            options=OPTIONS,
            devices=("cpu",),
            compile=compile_group,
        )
    ]


def compile_group(fn: Callable[..., Any], group: Any, config: Any) -> Callable[..., Any]:
    """The ``openvino`` backend's compile of one region group (``BackendSpec.compile``)."""
    register_openvino_backend()
    # OpenVINO's direct path (make_fx inside Dynamo's trace) fails on torch 2.13 for any graph
    # with a view ("IndexError: list index out of range" while Dynamo builds shape guards);
    # its AOTAutograd path does not. So that path is the default here, unless set explicitly.
    options = {"aot_autograd": True, **config.options}
    return compile_with_torch(fn, attrs.evolve(config, options=options), NAME)
