"""What a ``wrap_distributed`` implementation returns."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs
from torch import nn


@attrs.frozen
class DistributedResult:
    """Returned by a ``wrap_distributed`` implementation.

    ``torchkiln.compile`` returns ``wrapped``; the rest is kept so that
    :func:`torchkiln.unwrap` and :func:`torchkiln.full_state_dict` work on it.
    """

    wrapped: Any
    """What ``torchkiln.compile`` returns: the model itself (``none``, FSDP2), the
    ``DistributedDataParallel`` module, or the DeepSpeed engine."""
    module: nn.Module
    """The plain user module, holding the compiled regions."""
    strategy: str
    extras: Mapping[str, Any] = attrs.Factory(dict)
    """Whatever else the engine returned (DeepSpeed: ``optimizer``, ``lr_scheduler``, ...)."""
    full_state_dict: Callable[[], dict[str, Any]] | None = None
    """Returns the full, unsharded state dict with the plain module's keys (on rank 0 at
    least); ``None`` means :func:`full_state_dict` works it out from the wrapper's type."""
