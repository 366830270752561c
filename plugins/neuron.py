"""Built-in plugin: AWS Trainium through TorchNeuron, backend ``neuron``.

torch-neuronx registers its ``neuron`` dynamo backend through torch's own
``torch_dynamo_backends`` entry-point group, so torch finds it by name without an import; the
probe still imports ``torch_neuronx`` to say clearly when it is missing. Neuron's backend takes
only the ``default`` mode, and rejects ``dynamic=True`` while compiling, so torchkiln rejects
both when the configuration is read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torchkiln.plugin import (
    Availability,
    BackendSpec,
    CompileConfig,
    ConfigError,
    ConfigProblem,
    RegionGroup,
    compile_with_torch,
    hookimpl,
    probe_import,
    torch_knows,
)

NAME = "neuron"
INSTALL_HINT = (
    "pip install torch-neuronx (TorchNeuron, on a Trn2/Trn3 instance; "
    "https://awsdocs-neuron.readthedocs-hosted.com)"
)


def probe() -> Availability:
    availability = probe_import("torch_neuronx", INSTALL_HINT)
    if availability.available and not torch_knows(NAME):
        return Availability.no(
            "torch_neuronx is installed but registers no 'neuron' torch.compile backend "
            "(the XLA-based torch-neuronx does not; TorchNeuron does): " + INSTALL_HINT
        )
    return availability


@hookimpl
def declare_backends() -> Sequence[BackendSpec]:
    # Neuron reads a few undocumented option keys, so options pass through unchecked.
    return [
        BackendSpec(
            NAME,
            "AWS Neuron (Trainium) through TorchNeuron's neuron backend",
            probe=probe,
            training=True,
            modes=("default",),
            devices=("neuron",),
            compile=compile_group,
        )
    ]


@hookimpl
def resolve_compile_config(
    config: CompileConfig, sources: Mapping[str, str]
) -> Mapping[str, Any] | None:
    if config.backend == NAME and config.dynamic is True:
        raise ConfigError(
            [
                ConfigProblem(
                    "$.dynamic",
                    "the neuron backend rejects dynamic=True; allowed: None (torch's automatic "
                    "dynamic shapes) or False",
                    sources.get("dynamic", ""),
                )
            ]
        )
    return None


def compile_group(
    fn: Callable[..., Any], group: RegionGroup, config: CompileConfig
) -> Callable[..., Any]:
    """The ``neuron`` backend's compile of one region group (``BackendSpec.compile``)."""
    return compile_with_torch(fn, config, NAME)
