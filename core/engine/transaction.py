"""All or nothing: what ``torchkiln.compile`` puts back when it fails after touching the model
(docs/guide.md, "All or nothing").

:class:`Snapshot` records every module's class and ``__dict__``, each parameter's and buffer's
``requires_grad`` and ``.data``, the environment and ``torch._dynamo.config``. Parameter
*values* are not copied (that would double the model's memory): an in-place write to them is
detected from a sample, and :meth:`Snapshot.changed_values` names the tensors.
"""

from __future__ import annotations

import os
from typing import Any

import attrs
import torch
from torch import nn

from torchkiln._internals import dynamo
from torchkiln._internals.autograd import version_counter

SAMPLE = 64
"""Elements of each parameter and buffer kept to detect in-place writes (evenly spaced)."""

_EMPTY: dict[Any, Any] = {}


@attrs.define(eq=False)
class _ModuleSnapshot:
    module: nn.Module
    cls: type
    attributes: dict[str, Any]
    contents: dict[str, dict[Any, Any]]
    """Each dict-valued attribute (``_parameters``, ``_modules``, hook dicts), copied."""

    @classmethod
    def take(cls, module: nn.Module) -> _ModuleSnapshot:
        attributes = dict(module.__dict__)
        # Most of a module's dicts (hooks) are empty: share one empty copy for them.
        contents = {
            key: dict(value) if value else _EMPTY
            for key, value in attributes.items()
            if isinstance(value, dict)
        }
        return cls(module, type(module), attributes, contents)

    def restore(self) -> None:
        module = self.module
        if type(module) is not self.cls:
            object.__setattr__(module, "__class__", self.cls)  # FSDP2 swaps in a subclass
        current = module.__dict__
        for key in [key for key in current if key not in self.attributes]:
            del current[key]
        for key, value in self.attributes.items():
            saved = self.contents.get(key)
            if saved is not None and _changed(value, saved):
                value.clear()
                value.update(saved)
            current[key] = value


def _changed(now: dict[Any, Any], saved: dict[Any, Any]) -> bool:
    return now.keys() != saved.keys() or any(now[k] is not v for k, v in saved.items())


def _sample(tensor: torch.Tensor) -> torch.Tensor | None:
    """Up to :data:`SAMPLE` evenly spaced elements, as bytes; ``None`` where they cannot be
    read cheaply (meta, tensor subclasses such as DTensor, non-contiguous)."""
    if type(tensor) not in (torch.Tensor, nn.Parameter) or tensor.device.type == "meta":
        return None
    if not tensor.is_contiguous() or tensor.numel() == 0:
        return None
    with torch.no_grad():
        flat = tensor.detach().reshape(-1)
        step = max(1, flat.numel() // SAMPLE)
        return flat[::step][:SAMPLE].clone().view(torch.uint8)


@attrs.define(eq=False)
class _TensorSnapshot:
    name: str
    tensor: torch.Tensor
    data: torch.Tensor
    """``tensor.data`` then: the same storage, kept so a rebinding can be undone."""
    requires_grad: bool
    version: int
    sample: torch.Tensor | None

    @classmethod
    def take(cls, name: str, tensor: torch.Tensor) -> _TensorSnapshot:
        return cls(
            name,
            tensor,
            tensor.data,
            tensor.requires_grad,
            version_counter(tensor),
            _sample(tensor),
        )

    def restore(self) -> None:
        tensor = self.tensor
        if tensor.data.data_ptr() != self.data.data_ptr() or tensor.shape != self.data.shape:
            tensor.data = self.data
        if tensor.requires_grad != self.requires_grad and tensor.is_leaf:
            tensor.requires_grad_(self.requires_grad)

    def values_changed(self) -> bool:
        """The sample differs; without a sample, the version counter moved. (A moved counter
        with the same sample is DDP broadcasting the values every rank already holds.)"""
        if self.sample is None:
            return version_counter(self.tensor) != self.version
        now = _sample(self.tensor)
        return now is None or not torch.equal(now, self.sample)


@attrs.define(eq=False)
class Snapshot:
    """The model and the process-wide state before ``torchkiln.compile`` touched anything."""

    modules: list[_ModuleSnapshot]
    environment: dict[str, str]
    dynamo: dict[str, Any]
    tensors: list[_TensorSnapshot] = attrs.Factory(list)

    @classmethod
    def take(cls, model: nn.Module) -> Snapshot:
        tensors = [*model.named_parameters(), *model.named_buffers()]
        return cls(
            [_ModuleSnapshot.take(module) for module in model.modules()],
            dict(os.environ),
            dynamo.config().get_config_copy(),
            [_TensorSnapshot.take(name, t) for name, t in tensors if t is not None],
        )

    def restore(self) -> None:
        """Put everything back (modules first, then tensors' flags and data, then settings)."""
        for snapshot in self.modules:
            snapshot.restore()
        for tensor in self.tensors:
            tensor.restore()
        self._restore_environment()
        self._restore_dynamo()

    def changed_values(self) -> list[str]:
        """Names of the parameters and buffers whose values were written in place since
        :meth:`take` (which :meth:`restore` cannot undo)."""
        return [tensor.name for tensor in self.tensors if tensor.values_changed()]

    def _restore_environment(self) -> None:
        for key in [key for key in os.environ if key not in self.environment]:
            del os.environ[key]
        for key, value in self.environment.items():
            if os.environ.get(key) != value:
                os.environ[key] = value

    def _restore_dynamo(self) -> None:
        config = dynamo.config()
        now = config.get_config_copy()
        for key, value in self.dynamo.items():
            if now.get(key, value) is not value and now.get(key) != value:
                setattr(config, key, value)
