"""Contracts of ``torchkiln._internals.autograd``: each adapter function works on this torch."""

from __future__ import annotations

import torch

from torchkiln._internals import autograd


def test_version_counter() -> None:
    tensor = torch.zeros(3)
    before = autograd.version_counter(tensor)
    assert isinstance(before, int)
    tensor.add_(1)
    assert autograd.version_counter(tensor) == before + 1
    tensor.data[0] = 5  # a write through .data moves the counter too
    tensor[1:].mul_(2)  # and through a view
    assert autograd.version_counter(tensor) > before + 1
    tensor.clone()
    assert autograd.version_counter(tensor) == autograd.version_counter(tensor)
