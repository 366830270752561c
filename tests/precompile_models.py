"""Small models for the precompile tests, importable by the new processes the tests start."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

WIDTH = 16


class Block(nn.Module):
    """A pre-norm MLP block with a residual and a float attribute the guards watch."""

    def __init__(self, width: int = WIDTH) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)
        self.scale = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.scale * self.down(F.gelu(self.up(self.norm(x))))


def logged(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A decorator like transformers' (``functools.wraps``): the class attribute is the wrapper,
    not the function Dynamo traces into."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


class DecoratedBlock(Block):
    @logged
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Stack(nn.Module):
    def __init__(self, depth: int = 3, width: int = WIDTH, block: type[nn.Module] = Block) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(block(width) for _ in range(depth))
        self.head = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def stack(depth: int = 3, decorated: bool = False) -> Stack:
    torch.manual_seed(0)
    return Stack(depth, block=DecoratedBlock if decorated else Block)


def inputs(batch: int = 2, seq: int = 4) -> torch.Tensor:
    return torch.randn(batch, seq, WIDTH, generator=torch.Generator().manual_seed(1))


def example_inputs(model: nn.Module, batch: int = 2, seq: int = 4) -> torch.Tensor:
    """What ``torchkiln precompile tests.precompile_models:stack`` feeds the model."""
    return inputs(batch, seq)
