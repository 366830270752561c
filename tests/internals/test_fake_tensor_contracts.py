"""Contracts of ``torchkiln._internals.fake_tensor``: each adapter function works on this torch."""

from __future__ import annotations

import torch
from torch import nn

from torchkiln._internals.fake_tensor import fake_tensor_mode


def test_fake_tensor_mode() -> None:
    layer = nn.Linear(4, 3)  # real weights, used inside the mode
    with fake_tensor_mode(allow_non_fake_inputs=True):
        out = layer(torch.ones(2, 4))
    assert type(out).__name__ == "FakeTensor"
    assert out.shape == (2, 3) and out.dtype == torch.float32
