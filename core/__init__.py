"""torchkiln: regional, in-place ``torch.compile`` for large models.

>>> import torchkiln
>>> model = torchkiln.compile(model, backend="inductor")   # the same object, compiled in place
>>> torchkiln.report(model)                                # after the first call
"""

from __future__ import annotations

from torchkiln.cache import load_cache_artifacts, save_cache_artifacts
from torchkiln.config import CompileConfig
from torchkiln.distributed import distributed_result, full_state_dict, unwrap
from torchkiln.errors import (
    ConfigError,
    DistributedError,
    PluginError,
    RegionCompileError,
    TorchkilnError,
)
from torchkiln.hookspecs import hookimpl
from torchkiln.pipeline import compile, decompile, is_compiled, plan, report
from torchkiln.plugin_manager import PluginManager, get_plugin_manager

__version__ = "0.1.0"

__all__ = [
    "CompileConfig",
    "ConfigError",
    "DistributedError",
    "PluginError",
    "PluginManager",
    "RegionCompileError",
    "TorchkilnError",
    "__version__",
    "compile",
    "decompile",
    "distributed_result",
    "full_state_dict",
    "get_plugin_manager",
    "hookimpl",
    "is_compiled",
    "load_cache_artifacts",
    "plan",
    "report",
    "save_cache_artifacts",
    "unwrap",
]
