"""Built-in plugin: the ``deepspeed`` distributed strategy (ZeRO stages 0-3).

Order: ``deepspeed.initialize`` first, then in-place compile of ``engine.module`` (which *is*
the user's model). DeepSpeed installs its own hooks while it initialises (ZeRO-3 gathers each
submodule's parameters in forward pre-hooks); compiling afterwards leaves those hooks eager.
Under ZeRO-3 those hooks split each block's graph, so expect several graphs per region.

DeepSpeed is optional (``pip install 'torchkiln[deepspeed]'``) and imported only when this
strategy runs. ``distributed.deepspeed.config`` is DeepSpeed's own configuration (a mapping or
the path of its JSON file); ``distributed.options`` are further keyword arguments of
``deepspeed.initialize``. docs/distributed.md ("``deepspeed``: initialize, then compile
``engine.module``") says how to pass an optimizer.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from torch import nn

from torchkiln.plugin import (
    LAUNCH_HINT,
    Availability,
    CompileConfig,
    DistributedError,
    DistributedResult,
    DistributedSpec,
    check_not_wrapped,
    check_options,
    hookimpl,
    launched_by_launcher,
    process_group_ready,
)

STRATEGY = "deepspeed"
INSTALL_HINT = "DeepSpeed is not installed: pip install 'torchkiln[deepspeed]'"
CONFIG_EXAMPLE = (
    '{"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 2}, '
    '"optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}'
)


def probe() -> Availability:
    """Whether DeepSpeed is installed (without importing it: that takes seconds)."""
    if importlib.util.find_spec("deepspeed") is None:
        return Availability.no(INSTALL_HINT)
    return Availability.yes()


@hookimpl
def declare_distributed() -> list[DistributedSpec]:
    return [
        DistributedSpec(
            STRATEGY,
            "DeepSpeed ZeRO 0-3: deepspeed.initialize, then in-place compile of engine.module",
            probe=probe,
        )
    ]


def deepspeed_config(config: CompileConfig) -> dict[str, Any] | str:
    """DeepSpeed's configuration from ``distributed.deepspeed.config``: a copy of the mapping,
    or the path of an existing JSON file."""
    value = config.distributed.deepspeed.config
    if value is None:
        raise DistributedError(
            "strategy 'deepspeed' needs DeepSpeed's own configuration in "
            "distributed.deepspeed.config: a mapping or the path of its JSON file, e.g. "
            f"{CONFIG_EXAMPLE}"
        )
    if isinstance(value, Mapping):
        return dict(value)
    path = Path(value).expanduser()
    if not path.is_file():
        raise DistributedError(
            f"distributed.deepspeed.config names {str(value)!r}, which is not a file; give the "
            "path of DeepSpeed's JSON configuration, or the configuration as a mapping"
        )
    return str(path)


def require_launch() -> None:
    """DeepSpeed initialises the process group itself from the launcher's environment."""
    if process_group_ready() or launched_by_launcher(os.environ):
        return
    raise DistributedError(
        "distributed strategy 'deepspeed' needs an initialised process group or a launcher's "
        "environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), and there is neither. Launch "
        "with `deepspeed --num_gpus=2 script.py` (several machines: --hostfile) or "
        f"`torchrun --nproc_per_node=2 script.py`; or call `deepspeed.init_distributed()`. {LAUNCH_HINT}"
    )


@hookimpl
def wrap_distributed(
    model: nn.Module, config: CompileConfig, compile_regions: Callable[[nn.Module], None]
) -> DistributedResult:
    if not (availability := probe()).available:
        raise DistributedError(availability.reason)
    require_launch()
    import deepspeed  # picks its accelerator itself; DS_ACCELERATOR=cpu silences its CPU warning

    check_not_wrapped(model, STRATEGY)
    kwargs = check_options(
        STRATEGY,
        "deepspeed.initialize",
        deepspeed.initialize,
        config.distributed.options,
        reserved=("model", "config", "config_params", "args"),
    )
    kwargs.setdefault("model_parameters", [p for p in model.parameters() if p.requires_grad])
    engine, optimizer, dataloader, scheduler = deepspeed.initialize(
        model=model, config=deepspeed_config(config), **kwargs
    )
    if engine.module is not model:
        raise DistributedError(
            "deepspeed.initialize replaced the model: engine.module is not the "
            "module given to torchkiln.compile, so it cannot be compiled in place"
        )
    compile_regions(engine.module)
    return DistributedResult(
        wrapped=engine,
        module=model,
        strategy=STRATEGY,
        extras={
            "optimizer": optimizer,
            "training_dataloader": dataloader,
            "lr_scheduler": scheduler,
        },
    )
