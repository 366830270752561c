"""CUDA-graph steps for regionally compiled models (``mode="reduce-overhead"``).

Without an explicit :func:`torch.compiler.cudagraph_mark_step_begin`, inductor's CUDA-graph
trees start a new step at every entry into a compiled function. With regional compilation each
block is its own compiled function, so under ``no_grad`` the second block starts a new step and
the first block's output (its input) counts as overwritten: CUDA-graph trees refuse it. Full
``torch.compile`` does not meet this: the model is one compiled function. The fix is what torch
asks of users who drive CUDA graphs by hand: mark a step at the start of each call of the
*model*, from a forward pre-hook (:func:`install_step_marker`) that ``decompile`` removes.
Marking a step is process-wide in torch: :func:`install_step_marker` says what that means for
other compiled models. docs/configuration.md (``mode``) says when the marker is installed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from torchkiln.configuration.config import CompileConfig

CUDA_GRAPH_MODES = frozenset({"reduce-overhead", "max-autotune"})
"""``torch.compile`` modes that turn on inductor's CUDA graphs (``triton.cudagraphs``)."""


def uses_cuda_graphs(config: CompileConfig) -> bool:
    """Whether ``config`` asks inductor for CUDA graphs (by mode or by option)."""
    if config.options.get("triton.cudagraphs") is not None:
        return bool(config.options["triton.cudagraphs"])
    return config.mode in CUDA_GRAPH_MODES


def _on_cuda(model: nn.Module) -> bool:
    parameter = next(model.parameters(), None)
    return parameter is not None and parameter.is_cuda


def install_step_marker(model: nn.Module) -> Callable[[], None]:
    """Mark a CUDA-graph step before each inference call of ``model``; returns the undo.

    The hook acts only while gradients are off (with gradients on, CUDA-graph trees already
    keep a step open until the backward runs, as for full compile) and only when the model's
    parameters are on a CUDA device; the pipeline installs it only for plans of more than one
    region. Marking a step is process-wide in torch (once marked, trees wait for explicit
    marks): the hook marks one at every inference call of this model, so other compiled models
    in the process keep stepping as long as this one is called; a loop that runs only *other*
    CUDA-graph models afterwards should mark its own steps, as torch documents.
    """

    def mark_step(module: nn.Module, args: Any) -> None:
        if not torch.is_grad_enabled() and _on_cuda(module):
            torch.compiler.cudagraph_mark_step_begin()

    return model.register_forward_pre_hook(mark_step).remove
