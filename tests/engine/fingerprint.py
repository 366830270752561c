"""A model's and the process's observable state, to assert "exactly as before"."""

from __future__ import annotations

import os
from typing import Any

import attrs
import torch
from torch import nn

from torchkiln.artifacts.cache import CACHE_DIR_ENV


def _forward(module: nn.Module) -> Any:
    # The instance forward when there is one, by identity; else the class's function.
    return module.__dict__.get("forward", type(module).forward)


@attrs.frozen
class Fingerprint:
    classes: tuple[type, ...]
    forwards: tuple[int, ...]
    dict_keys: tuple[tuple[str, ...], ...]
    hooks: tuple[int, ...]
    tensor_ids: tuple[int, ...]
    tensor_bytes: tuple[bytes, ...]
    tensor_tags: tuple[tuple[str, ...], ...]
    cache_dir: str | None
    dynamo: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, model: nn.Module) -> Fingerprint:
        import torch._dynamo.config as dynamo_config

        modules = list(model.modules())
        tensors = [*model.parameters(), *model.buffers()]
        return cls(
            classes=tuple(type(m) for m in modules),
            forwards=tuple(id(_forward(m)) for m in modules),
            dict_keys=tuple(tuple(sorted(m.__dict__)) for m in modules),
            hooks=tuple(
                len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
                for m in modules
            ),
            tensor_ids=tuple(id(t) for t in tensors),
            tensor_bytes=tuple(
                t.detach().contiguous().view(torch.uint8).numpy().tobytes() for t in tensors
            ),
            tensor_tags=tuple(tuple(sorted(t.__dict__)) for t in tensors),
            cache_dir=os.environ.get(CACHE_DIR_ENV),
            dynamo=tuple(
                (k, v)
                for k, v in sorted(dynamo_config.get_config_copy().items())
                if isinstance(v, bool | int | float | str | None)
            ),
        )

    def differences(self, other: Fingerprint) -> list[str]:
        return [
            field.name
            for field in attrs.fields(Fingerprint)
            if getattr(self, field.name) != getattr(other, field.name)
        ]
