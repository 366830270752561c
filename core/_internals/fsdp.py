"""torch.distributed's private composable APIs that torchkiln calls
(``torch.distributed._composable``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn


def checkpoint_activations(module: nn.Module) -> None:
    """Make ``module`` recompute its activations in the backward pass instead of keeping them
    (in place: ``module`` stays the same object, with the same parameter names).

    Calls ``torch.distributed._composable.checkpoint``, the composable form ``fully_shard``
    works with; ``torch.utils.checkpoint`` wraps a function call, not a module in place.
    Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    from torch.distributed._composable import checkpoint

    checkpoint(module)
