"""The public API for plugin authors: everything a backend, selector or distributed plugin needs.

A plugin imports from this module and :mod:`torchkiln` only, as the built-in plugins do; names
here are stable within a major version. The hooks are in :mod:`torchkiln.plugin_host.hooks`::

    from torchkiln.plugin import BackendSpec, compile_with_torch, hookimpl

    @hookimpl
    def declare_backends():
        return [BackendSpec("mybackend", "my compiler")]

    @hookimpl
    def compile_region(fn, group, config, backend):
        return compile_with_torch(fn, config, backend="my_torch_backend_name")
"""

from __future__ import annotations

from torchkiln.configuration.config import (
    CompileConfig,
    DDPConfig,
    DeepSpeedConfig,
    DistributedConfig,
    FSDP2Config,
    FSDP2MixedPrecision,
    RegionsConfig,
)
from torchkiln.distributed import (
    LAUNCH_HINT,
    check_not_wrapped,
    check_options,
    launched_by_launcher,
    process_group_ready,
    require_process_group,
)
from torchkiln.engine.compile_state import add_undo
from torchkiln.engine.settings import Hold, hold_setting
from torchkiln.engine.structure import (
    StructureIndex,
    check_group,
    check_plan,
    difference_kind,
    drop_excluded,
    forward_code_problems,
    group_by_structure,
    is_excluded,
    same_structure,
    structural_difference,
    structure_key,
)
from torchkiln.errors import (
    ConfigError,
    ConfigProblem,
    DistributedError,
    PartialCompileWarning,
    PluginError,
    RegionCompileError,
    TorchkilnError,
)
from torchkiln.plugin_host import hooks as _hooks
from torchkiln.plugin_host.declarations import (
    Availability,
    BackendSpec,
    DistributedSpec,
    LayerCacheSpec,
    SelectorSpec,
)
from torchkiln.plugin_host.distributed_result import DistributedResult
from torchkiln.plugin_host.group_preparation import GroupPreparation, RegionFunction
from torchkiln.plugin_host.hooks import PROJECT_NAME, hookimpl, hookspec
from torchkiln.plugin_host.region_plan import EagerPart, Region, RegionGroup, RegionPlan
from torchkiln.plugin_host.report_causes import ReportCause
from torchkiln.plugin_host.selection import select_with
from torchkiln.plugin_host.torch_backends import (
    DynamoBackend,
    compile_with_torch,
    probe_import,
    torch_backend,
    torch_backend_names,
    torch_knows,
)

HOOK_NAMES: tuple[str, ...] = tuple(
    name for name, value in vars(_hooks).items() if hasattr(value, f"{PROJECT_NAME}_spec")
)
"""Every hook torchkiln specifies, in the order :mod:`torchkiln.plugin_host.hooks` defines them
(pluggy's ``hookspec`` marks each one with a ``torchkiln_spec`` attribute)."""

__all__ = [
    "HOOK_NAMES",
    "LAUNCH_HINT",
    "PROJECT_NAME",
    "Availability",
    "BackendSpec",
    "CompileConfig",
    "ConfigError",
    "ConfigProblem",
    "DDPConfig",
    "DeepSpeedConfig",
    "DistributedConfig",
    "DistributedError",
    "DistributedResult",
    "DistributedSpec",
    "DynamoBackend",
    "EagerPart",
    "FSDP2Config",
    "FSDP2MixedPrecision",
    "GroupPreparation",
    "Hold",
    "LayerCacheSpec",
    "PartialCompileWarning",
    "PluginError",
    "Region",
    "RegionCompileError",
    "RegionFunction",
    "RegionGroup",
    "RegionPlan",
    "RegionsConfig",
    "ReportCause",
    "SelectorSpec",
    "StructureIndex",
    "TorchkilnError",
    "add_undo",
    "check_group",
    "check_not_wrapped",
    "check_options",
    "check_plan",
    "compile_with_torch",
    "difference_kind",
    "drop_excluded",
    "forward_code_problems",
    "group_by_structure",
    "hold_setting",
    "hookimpl",
    "hookspec",
    "is_excluded",
    "launched_by_launcher",
    "probe_import",
    "process_group_ready",
    "require_process_group",
    "same_structure",
    "select_with",
    "structural_difference",
    "structure_key",
    "torch_backend",
    "torch_backend_names",
    "torch_knows",
]
