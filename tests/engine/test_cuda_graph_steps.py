"""Regional compile under ``mode="reduce-overhead"``: one CUDA-graph step per model call.

CUDA graphs need a GPU; what is checked here is torchkiln's part, on CPU: the step marker is
installed only for CUDA-graph modes and plans of several regions, marks a step per inference
call (not per block, not with gradients on), and decompile removes it. The GPU run in
docs/benchmarks.md exercises the CUDA-graph path itself.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from stack_model import Stack
from torch._inductor import cudagraph_trees

import torchkiln
from torchkiln import pipeline
from torchkiln.configuration.config import CompileConfig


@pytest.fixture
def step_counter(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Pretend the parameters are on CUDA; restore torch's process-wide step counter."""
    monkeypatch.setattr(pipeline, "_on_cuda", lambda model: True)
    saved = cudagraph_trees.MarkStepBox.mark_step_counter
    cudagraph_trees.MarkStepBox.mark_step_counter = 0
    yield
    cudagraph_trees.MarkStepBox.mark_step_counter = saved


def steps() -> int:
    return -cudagraph_trees.MarkStepBox.mark_step_counter


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (CompileConfig(mode="reduce-overhead"), True),
        (CompileConfig(mode="max-autotune"), True),
        (CompileConfig(options={"triton.cudagraphs": True}), True),
        (CompileConfig(mode="max-autotune-no-cudagraphs"), False),
        (CompileConfig(), False),
        (CompileConfig(options={"triton.cudagraphs": False}), False),
    ],
)
def test_cuda_graph_modes_are_recognised(config: CompileConfig, expected: bool) -> None:
    assert pipeline.uses_cuda_graphs(config) is expected


def test_one_step_per_inference_call_none_with_gradients(step_counter: None) -> None:
    model = Stack()
    x = torch.randn(2, 8)
    expected = model(x)
    torchkiln.compile(
        model, CompileConfig(backend="inductor", mode="reduce-overhead", progress="off")
    )
    assert len(model._forward_pre_hooks) == 1
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(model(x), expected)
    assert steps() == 3  # one per model call, not one per block (Stack has 3)
    model(x).sum().backward()  # with gradients on, torch keeps the step open until backward
    assert steps() == 3
    torchkiln.decompile(model)
    assert len(model._forward_pre_hooks) == 0
    with torch.no_grad():
        model(x)
    assert steps() == 3


def test_no_marker_without_cuda_graphs_or_with_one_region(step_counter: None) -> None:
    default = Stack()
    torchkiln.compile(default, CompileConfig(backend="eager", progress="off"))
    whole = Stack()
    torchkiln.compile(
        whole,
        CompileConfig(backend="inductor", mode="reduce-overhead", progress="off",
                      regions={"strategy": "whole"}),
    )  # fmt: skip
    with torch.no_grad():
        default(torch.randn(2, 8))
        whole(torch.randn(2, 8))
    assert len(default._forward_pre_hooks) == len(whole._forward_pre_hooks) == 0
    assert steps() == 0
