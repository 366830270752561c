"""Built-in plugin: the ``none`` distributed strategy (one process, no wrapper)."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from torchkiln.plugin import DistributedResult, DistributedSpec, hookimpl


@hookimpl
def declare_distributed() -> list[DistributedSpec]:
    return [DistributedSpec("none", "no distributed engine: compile the model in place")]


@hookimpl
def wrap_distributed(
    model: nn.Module, compile_regions: Callable[[nn.Module], None]
) -> DistributedResult:
    compile_regions(model)
    return DistributedResult(wrapped=model, module=model, strategy="none")
