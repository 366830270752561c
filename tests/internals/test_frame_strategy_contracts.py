"""Contract of torchkiln._internals.frame_strategy on the installed torch."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from torchkiln._internals import frame_strategy


def scaled(x: torch.Tensor) -> torch.Tensor:
    try:
        return torch.nn.functional.layer_norm(x, (8,)) * 2
    finally:
        pass


@pytest.mark.usefixtures("reset_dynamo")
def test_resume_compiling_undoes_dynamos_skip_mark_and_the_next_call_compiles() -> None:
    compiled = torch.compile(scaled, backend="eager")
    torch._dynamo.eval_frame.skip_code(scaled.__code__)  # what a suppressed error leaves
    compiled(torch.randn(2, 8))
    assert counters["stats"]["unique_graphs"] == 0  # skipped: ran eagerly
    frame_strategy.resume_compiling(scaled.__code__)
    compiled(torch.randn(2, 8))
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.usefixtures("reset_dynamo")
def test_after_a_users_error_through_a_try_block_resume_compiling_lets_the_next_call_compile() -> (
    None
):
    """torch 2.14+ skip a frame for good when the user's error unwinds through its try block."""
    compiled = torch.compile(scaled, backend="eager")
    with pytest.raises(RuntimeError, match="normalized_shape"):
        compiled(torch.randn(2, 5))
    frame_strategy.resume_compiling(scaled.__code__)
    torch.testing.assert_close(compiled(torch.randn(2, 8)).shape, torch.Size([2, 8]))
    assert counters["stats"]["unique_graphs"] == 1
