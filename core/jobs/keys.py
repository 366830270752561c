"""The key a rank computes for one region group's first call: what must be equal for two ranks
to run the same compiled code.

The key covers the environment an artifact directory is keyed by (torch, Python, backend,
mode, options, dynamic, device type, dtype), the transformers and diffusers releases (a saved
function keeps no identity guard on their modules: :mod:`torchkiln.engine.saved_guards`), the
device's architecture (a GPU's name and compute capability; on the CPU, the vector ISA inductor
may use and the C++ compiler), the group's class, the source of its classes and of the classes
of the objects it holds, its parameter and buffer layout, the values of its plain attributes
(what Dynamo bakes into the code as constants: :mod:`torchkiln.jobs.attributes`), the wrappers
its traced code runs through, the call's input specs and its kind (training or inference), and
the device index: compiled code is bound to it (Dynamo's tensor guards compare it, inductor's
code enters that device), so ranks on cuda:0 and cuda:1 of one node never run one entry. Ranks
whose keys are equal receive one compile; a rank whose key differs compiles its own, and
:func:`differing_fields` names why.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from torchkiln.artifacts.directory import (
    class_name,
    code_hash,
    environment_key,
    input_spec,
    installed_version,
    structure_hash,
)
from torchkiln.configuration.config import CompileConfig
from torchkiln.engine.region_compiler import traced_wrappers
from torchkiln.jobs.attributes import differing_attributes, plain_attributes


def call_kind(module: nn.Module) -> str:
    """``training`` (grad enabled and the module in train mode) or ``inference``: the two kinds
    an artifact directory knows."""
    return "training" if torch.is_grad_enabled() and module.training else "inference"


def device_architecture(device: torch.device) -> dict[str, Any]:
    """What decides whether compiled code of one device runs on another of the same type."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return {
            "name": torch.cuda.get_device_name(index),
            "capability": list(torch.cuda.get_device_capability(index)),
        }
    if device.type == "cpu":
        from torchkiln.artifacts.isa_probe import compiler_version, cpu_capabilities

        return {"cpu": cpu_capabilities(), "compiler": compiler_version()}
    return {"type": device.type}


def _first_device(module: nn.Module) -> torch.device:
    for tensor in [*module.parameters(), *module.buffers()]:
        return tensor.device
    return torch.device("cpu")


CALL_FIELDS = ("inputs", "kind")
"""The fields of one call; the others are the group's (equal for every call of it)."""


def group_fields(
    config: CompileConfig, group: str, module: nn.Module, function: Callable[..., Any]
) -> dict[str, Any]:
    """The key's fields every call of the group shares (a precompiled directory serves all of
    the group's entries whose group fields are these); ``function`` is the group's function,
    whose ``wrap_traced`` wrappers (activation checkpointing) are part of what was compiled."""
    return {
        **environment_key(config, module),
        "transformers": installed_version("transformers"),
        "diffusers": installed_version("diffusers"),
        "architecture": device_architecture(_first_device(module)),
        "device_index": _first_device(module).index,
        "group": group,
        "class": class_name(module),
        "code": code_hash(module),
        "structure": structure_hash(module),
        "attributes": plain_attributes(module),
        "traced": list(traced_wrappers(function)),
    }


def share_fields(
    config: CompileConfig,
    group: str,
    module: nn.Module,
    function: Callable[..., Any],
    args: Any,
    kwargs: Mapping[str, Any],
) -> dict[str, Any]:
    """Every field of the key, by name (what :func:`differing_fields` compares)."""
    return {**group_fields(config, group, module, function), **call_fields(module, args, kwargs)}


def call_fields(module: nn.Module, args: Any, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The key's :data:`CALL_FIELDS` for one call of ``module``."""
    return {"inputs": input_spec(args, dict(kwargs)), "kind": call_kind(module)}


def share_key(fields: Mapping[str, Any]) -> str:
    """SHA-256 of the fields (canonical JSON), the name of a store entry."""
    text = json.dumps(fields, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def differing_fields(mine: Mapping[str, Any], other: Mapping[str, Any]) -> list[str]:
    """The names of the fields that differ, in key order (``structure``, ``inputs``, ...)."""
    return [name for name in mine if mine.get(name) != other.get(name)]


def describe_difference(mine: Mapping[str, Any], other: Mapping[str, Any]) -> str:
    """Why this rank's key differs from rank 0's, in words."""
    differ = differing_fields(mine, other)
    text = f"this rank's key differs from rank 0's in: {', '.join(differ)}"
    if "attributes" in differ:
        text += (
            f" ({differing_attributes(mine.get('attributes', {}), other.get('attributes', {}))}: "
            "Dynamo bakes such values into the compiled code, so rank 0's code would be wrong "
            "here)"
        )
    if "device_index" in differ:
        text += (
            f" (device index {mine.get('device_index')} here, {other.get('device_index')} on "
            "rank 0: compiled code is bound to its device index, so the entry cannot fit)"
        )
    return text
