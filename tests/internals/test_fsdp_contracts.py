"""Contracts of ``torchkiln._internals.fsdp``: each adapter function works on this torch."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from torchkiln._internals.fsdp import (
    activation_wrapped,
    checkpoint_activations,
    fsdp_classes_kept,
)


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


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 2)


def test_fsdp_classes_kept(tmp_path: Path) -> None:
    """``FSDPModule.__new__`` builds the class ``fully_shard`` made from, except inside
    ``fsdp_classes_kept`` (where torch's guard-state pickler rebuilds a saved block with
    ``type(obj).__new__``); put back after. A one-rank gloo group: ``fully_shard`` needs a mesh."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        from torch.distributed.fsdp import FSDPModule, fully_shard

        sharded = type(fully_shard(Block()))
        assert sharded is not Block and issubclass(sharded, FSDPModule)
        assert type(sharded.__new__(sharded)) is Block  # torch's own: the original class
        with fsdp_classes_kept():
            assert type(sharded.__new__(sharded)) is sharded
        assert type(sharded.__new__(sharded)) is Block
    finally:
        dist.destroy_process_group()


def test_activation_wrapped() -> None:
    """Through ``checkpoint_wrapper`` and ``offload_wrapper``, nested, to the block itself."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        checkpoint_wrapper,
        offload_wrapper,
    )

    block = Block()
    assert activation_wrapped(checkpoint_wrapper(block)) is block
    assert activation_wrapped(offload_wrapper(checkpoint_wrapper(block))) is block
    assert activation_wrapped(block) is block
