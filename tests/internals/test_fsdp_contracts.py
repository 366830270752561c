"""Contracts of ``torchkiln._internals.fsdp``: each adapter function works on this torch (no
process group needed)."""

from __future__ import annotations

import torch
from torch import nn

from torchkiln._internals.fsdp import checkpoint_activations


class Counted(nn.Linear):
    calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return super().forward(x)


def test_checkpoint_activations() -> None:
    """In place (same object, same parameter names); the forward runs again in backward."""
    block = Counted(2, 2)
    model = nn.Sequential(block, nn.Tanh())
    names = [name for name, _ in model.named_parameters()]
    checkpoint_activations(block)
    assert model[0] is block
    assert [name for name, _ in model.named_parameters()] == names
    model(torch.ones(1, 2, requires_grad=True)).sum().backward()
    assert block.calls == 2  # the forward and its recomputation
    assert block.weight.grad is not None
