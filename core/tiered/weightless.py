"""Sending a model's structure to another process without its weights.

A *weightless* tensor has the metadata of the tensor it stands for and a zero-byte storage (as
FSDP frees an unsharded parameter): Dynamo and inductor compile from metadata only, and a kernel
that read one would fail loudly, never compute on stale data. :func:`dumps_weightless` pickles
any object graph with every parameter and every tensor above :data:`SMALL_TENSOR_BYTES`
weightless; small tensors (token ids, masks) keep their values, since tracing may branch on
them. Shared tensors (tied embeddings) stay shared.
"""

from __future__ import annotations

import io
import pickle
import weakref
from typing import Any

import torch
from torch import nn

from torchkiln._internals import accelerate

SMALL_TENSOR_BYTES = 1 << 16
"""Tensors up to this size keep their values in the pickle (64 KiB)."""


def weightless_tensor(
    shape: tuple[int, ...],
    stride: tuple[int, ...],
    dtype: torch.dtype,
    device: str,
    requires_grad: bool,
    parameter: bool,
) -> torch.Tensor:
    """A tensor with this metadata and a zero-byte storage.

    The storage is allocated, then released at once: on an accelerator this costs one tensor's
    size for an instant, never a second copy of the model.
    """
    tensor = torch.empty_strided(shape, stride, dtype=dtype, device=device)
    tensor.untyped_storage().resize_(0)
    if parameter:
        return nn.Parameter(tensor, requires_grad=requires_grad)
    return tensor.requires_grad_(requires_grad) if requires_grad else tensor


def _description(tensor: torch.Tensor) -> tuple[Any, ...]:
    return (
        tuple(tensor.shape),
        tuple(tensor.stride()),
        tensor.dtype,
        str(tensor.device),
        tensor.requires_grad,
        isinstance(tensor, nn.Parameter),
    )


def _small(tensor: torch.Tensor) -> bool:
    return tensor.numel() * tensor.element_size() <= SMALL_TENSOR_BYTES


def _plain_copy(tensor: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    return tensor.detach().clone().requires_grad_(requires_grad)


class _WeightlessPickler(pickle.Pickler):
    def __init__(self, file: Any, protocol: int):
        super().__init__(file, protocol=protocol)
        self._detached: dict[int, torch.Tensor] = {}
        """Small tensors' detached views, pickled by torch's own reduction (kept alive so
        their ids stay theirs while pickling)."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, weakref.ref):
            # Back-references to what wraps the model (torchkiln's marker of the DDP module
            # holding it): the builder has no wrapper, and a weak reference cannot pickle.
            return _none, ()
        if type(obj) not in (torch.Tensor, nn.Parameter) or id(obj) in self._detached:
            return NotImplemented
        if obj.device.type == "meta" or type(obj) is nn.Parameter or not _small(obj):
            return weightless_tensor, _description(obj)
        detached = obj.detach()
        self._detached[id(detached)] = detached
        return _plain_copy, (detached, obj.requires_grad)


def _none() -> None:
    return None


def dumps_weightless(obj: Any) -> bytes:
    """``obj`` pickled with large tensors (and every parameter) weightless.

    :raises pickle.PicklingError: something in ``obj`` cannot be pickled (a lambda hook, a
        class defined in ``__main__`` is pickled by reference and fails only when loaded:
        see :func:`unimportable_classes`).
    """
    buffer = io.BytesIO()
    _WeightlessPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()


def loads_weightless(data: bytes) -> Any:
    """The object :func:`dumps_weightless` pickled, its large tensors weightless. Only for data this
    process's parent wrote into a directory only this user can write (see the builder)."""
    return pickle.loads(data)


def unimportable_classes(model: nn.Module) -> list[str]:
    """Classes of ``model``'s modules that another process cannot import by name."""
    classes = [type(module) for module in model.modules()]
    foreign = [c for c in classes if c.__module__ == "__main__" or "<locals>" in c.__qualname__]
    return list(dict.fromkeys(f"{c.__module__}.{c.__qualname__}" for c in foreign))


def accelerate_hooked(model: nn.Module) -> list[str]:
    """Paths of ``model``'s modules that carry an Accelerate hook (a device map, CPU offload):
    its wrapper is a local function another process cannot unpickle, and an offloaded module's
    weights are not in the model to send."""
    return [
        path or "<root>"
        for path, module in model.named_modules()
        if accelerate.attached_hook(module) is not None
    ]


def unsendable(model: nn.Module) -> str | None:
    """Why ``model`` cannot be sent to a builder process, else ``None``."""
    foreign = unimportable_classes(model)
    if foreign:
        return (
            f"the model's classes {', '.join(foreign[:3])} cannot be imported by another "
            "process (defined in __main__ or a function): move them into a module"
        )
    hooked = accelerate_hooked(model)
    if hooked:
        return (
            f"Accelerate's hooks ({len(hooked)} modules, from {hooked[0]}) cannot be sent to a "
            "builder process: a model loaded with a device map or offloaded stays regional"
        )
    return None
