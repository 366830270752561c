"""Built-in plugin: PyTorch/XLA (TPUs and other XLA devices), backends ``xla`` and
``xla_inference``.

torch registers the ``openxla`` (forward and backward, through AOTAutograd) and ``openxla_eval``
(forward only) dynamo backends itself; on first use both hand each graph to
``torch_xla.core.dynamo_bridge``. So all this plugin needs is torch_xla importable, and the
model and its inputs on the XLA device (``torch_xla.device()``).
"""

from __future__ import annotations

import functools
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
)

INSTALL_HINT = "pip install torch_xla (https://github.com/pytorch/xla#installation)"
BRIDGE = "torch_xla.core.dynamo_bridge"
TORCH_BACKENDS = {
    "xla": "openxla",
    "xla_inference": "openxla_eval",
    "openxla": "openxla",
    "openxla_eval": "openxla_eval",
}
"""Our name -> the torch backend name. torch's own names are declared too, so that asking for
``openxla`` is probed for torch_xla like ``xla`` is, rather than failing at the first call."""


def probe() -> Availability:
    return probe_import(BRIDGE, INSTALL_HINT)


@hookimpl
def declare_backends() -> Sequence[BackendSpec]:
    # Both torch backends take neither mode nor options: openxla ignores them (AOTAutograd
    # logs and drops extra arguments) and openxla_eval raises, so say so up front.
    common: dict[str, Any] = dict(probe=probe, modes=(), options=(), devices=("xla",))
    training = "PyTorch/XLA through torch's openxla backend"
    inference = "PyTorch/XLA forward only (torch's openxla_eval); no backward"
    described = [
        ("xla", training, True),
        ("xla_inference", inference, False),
        ("openxla", "torch's name for xla", True),
        ("openxla_eval", "torch's name for xla_inference", False),
    ]
    return [
        BackendSpec(
            name,
            description,
            training=trains,
            compile=functools.partial(compile_group, torch_backend=TORCH_BACKENDS[name]),
            **common,
        )
        for name, description, trains in described
    ]


def compile_group(
    fn: Callable[..., Any], group: RegionGroup, config: CompileConfig, torch_backend: str
) -> Callable[..., Any]:
    """One XLA backend's compile of one region group (``BackendSpec.compile``, with its torch
    backend name bound)."""
    __import__(BRIDGE)  # fail now, naming torch_xla, rather than on the first forward call
    return compile_with_torch(fn, config, torch_backend)
