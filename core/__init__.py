"""torchkiln: regional, in-place ``torch.compile`` for large models.

>>> import torchkiln
>>> model = torchkiln.compile(model, backend="inductor")   # the same object, compiled in place
>>> torchkiln.report(model)                                # after the first call

The public names are imported on first use (PEP 562), so ``import torchkiln`` (and the pytest
plugin ``torchkiln.testing``) does not import torch until something needs it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from torchkiln._internals.versions import warn_if_untested
from torchkiln.errors import (
    ConfigError,
    DistributedError,
    JobError,
    PluginError,
    RegionCompileError,
    TorchkilnError,
    UncoveredCallError,
)
from torchkiln.plugin_host.hooks import hookimpl

if TYPE_CHECKING:
    from torchkiln.artifacts.cache import load_cache_artifacts, save_cache_artifacts
    from torchkiln.configuration.config import CompileConfig
    from torchkiln.distributed import distributed_result, full_state_dict, unwrap
    from torchkiln.jobs.precompile import precompile
    from torchkiln.pipeline import compile, decompile, freeze, is_compiled, plan, report
    from torchkiln.plugin_host.default_manager import get_plugin_manager
    from torchkiln.plugin_host.plugin_manager import PluginManager

__version__ = "0.1.0"

warn_if_untested()  # once per process: a torch outside the tested range (docs/torch-releases.md)

_LAZY = {
    "CompileConfig": "torchkiln.configuration.config",
    "PluginManager": "torchkiln.plugin_host.plugin_manager",
    "get_plugin_manager": "torchkiln.plugin_host.default_manager",
    "compile": "torchkiln.pipeline",
    "decompile": "torchkiln.pipeline",
    "freeze": "torchkiln.pipeline",
    "is_compiled": "torchkiln.pipeline",
    "plan": "torchkiln.pipeline",
    "report": "torchkiln.pipeline",
    "unwrap": "torchkiln.distributed",
    "full_state_dict": "torchkiln.distributed",
    "distributed_result": "torchkiln.distributed",
    "save_cache_artifacts": "torchkiln.artifacts.cache",
    "load_cache_artifacts": "torchkiln.artifacts.cache",
    "precompile": "torchkiln.jobs.precompile",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'torchkiln' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "CompileConfig",
    "ConfigError",
    "DistributedError",
    "JobError",
    "PluginError",
    "PluginManager",
    "RegionCompileError",
    "TorchkilnError",
    "UncoveredCallError",
    "__version__",
    "compile",
    "decompile",
    "distributed_result",
    "freeze",
    "full_state_dict",
    "get_plugin_manager",
    "hookimpl",
    "is_compiled",
    "load_cache_artifacts",
    "plan",
    "precompile",
    "report",
    "save_cache_artifacts",
    "unwrap",
]
