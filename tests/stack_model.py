"""Small models shared by the test folders (importable by name: the root conftest puts tests/
on sys.path)."""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    """A small residual block; a stack of these is what the ``repeated`` selector finds."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.linear(x))


class Stack(nn.Module):
    """``depth`` identical blocks and a head: one repeated group of ``depth`` regions."""

    def __init__(self, depth: int = 3, width: int = 8) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)
