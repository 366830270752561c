"""Built-in plugin: the ``ddp`` distributed strategy (``DistributedDataParallel``).

Order: compile the regions in place first, then wrap. DDP's forward calls the user module,
whose compiled regions run as they would without DDP; DDP's gradient hooks sit on the
parameters, outside any compiled code. (``torch.compile(DDP(model))`` would instead make Dynamo
split the graph at DDP's buckets; compiling inside keeps the regions' graphs whole.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from torchkiln.plugin import (
    CompileConfig,
    DDPConfig,
    DistributedResult,
    DistributedSpec,
    check_not_wrapped,
    check_options,
    hookimpl,
    require_process_group,
)

STRATEGY = "ddp"


@hookimpl
def declare_distributed() -> list[DistributedSpec]:
    return [
        DistributedSpec(
            STRATEGY, "torch DistributedDataParallel: regions compiled in place, then wrapped"
        )
    ]


def ddp_kwargs(settings: DDPConfig, options: dict[str, Any], model: nn.Module) -> dict[str, Any]:
    """``DistributedDataParallel`` keyword arguments: ``distributed.ddp`` fields, overridden by
    ``distributed.options``; ``device_ids`` only for a model on one CUDA device."""
    from torch.nn.parallel import DistributedDataParallel

    kwargs: dict[str, Any] = {
        "find_unused_parameters": settings.find_unused_parameters,
        "gradient_as_bucket_view": settings.gradient_as_bucket_view,
        "static_graph": settings.static_graph,
    }
    if settings.bucket_cap_mb is not None:
        kwargs["bucket_cap_mb"] = settings.bucket_cap_mb
    if settings.broadcast_buffers is not None:
        # Passed only when set: torch 2.13 deprecates the argument and warns whenever it is given.
        kwargs["broadcast_buffers"] = settings.broadcast_buffers
    kwargs.update(
        check_options(
            STRATEGY,
            "DistributedDataParallel",
            DistributedDataParallel,
            options,
            reserved=("module",),
        )
    )
    if "device_ids" not in kwargs:
        devices = {p.device for p in model.parameters()}
        if len(devices) == 1 and (device := devices.pop()).type == "cuda":
            kwargs["device_ids"] = [device.index]
    return kwargs


@hookimpl
def wrap_distributed(
    model: nn.Module, config: CompileConfig, compile_regions: Callable[[nn.Module], None]
) -> DistributedResult:
    from torch.nn.parallel import DistributedDataParallel

    require_process_group(STRATEGY)
    check_not_wrapped(model, STRATEGY)
    kwargs = ddp_kwargs(config.distributed.ddp, config.distributed.options, model)
    compile_regions(model)
    wrapped = DistributedDataParallel(model, **kwargs)
    return DistributedResult(wrapped=wrapped, module=model, strategy=STRATEGY)
