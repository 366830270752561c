"""Autograd's private state of a tensor that torchkiln reads (the version counter)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def version_counter(tensor: torch.Tensor) -> int:
    """How many times ``tensor``'s storage was written in place (autograd's version counter;
    shared by views and ``.data``).

    Reads ``Tensor._version``: torch has no public accessor, and the counter is the only record
    of an in-place write that does not compare values. Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    return int(tensor._version)
