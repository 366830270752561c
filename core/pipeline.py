"""The public pipeline: ``compile``, ``plan``, ``decompile``, ``is_compiled``, ``report``."""

from __future__ import annotations

import logging
import sys
from typing import Any

from torch import nn

from torchkiln.cache import apply_cache_dir
from torchkiln.compile_report import CompileReport, build_report
from torchkiln.distributed import attach, check_result, distributed_result
from torchkiln.errors import DistributedError, PluginError, TorchkilnError
from torchkiln.plugin_manager import PluginManager, PluginsArg, as_plugin_manager
from torchkiln.progress import make_progress
from torchkiln.region_compiler import STATE_ATTR, Compiler, CompileState, add_undo, state_of
from torchkiln.region_compiler import decompile as _decompile_inplace
from torchkiln.region_plan import RegionPlan
from torchkiln.resolve import ConfigArg, ResolvedConfig, resolve_config
from torchkiln.selection import planning_with
from torchkiln.structure import check_plan

logger = logging.getLogger("torchkiln")


def _plan(model: nn.Module, resolved: ResolvedConfig, pm: PluginManager) -> RegionPlan:
    config = resolved.config
    selector = config.regions.strategy
    with planning_with(pm):
        plan = pm.select_regions(model=model, config=config, selector=selector)
    declared = pm.selectors().get(selector)
    check_plan(plan, model, plugin=declared.plugin if declared is not None else "")
    # A fallback to the whole model, or a plan that compiles nothing, is never silent.
    fell_back = plan.selector != selector and plan.selector == "whole"
    level = logging.WARNING if fell_back or not plan.groups else logging.INFO
    logger.log(level, "torchkiln: %s", plan.reason or f"selected {plan.region_count} regions")
    return plan


def plan(
    model: nn.Module,
    config: ConfigArg = None,
    *,
    plugins: PluginsArg = None,
    **options: Any,
) -> RegionPlan:
    """The region plan for ``model``, without compiling anything.

    :param model: the root module.
    :param config: see :func:`torchkiln.compile`.
    :param plugins: see :func:`torchkiln.compile`.
    :param options: ``CompileConfig`` fields.
    :return: each region's path and group, what stays eager and why.
    """
    pm = as_plugin_manager(plugins).ensure_loaded()
    return _plan(model, resolve_config(config, plugins=pm, **options), pm)


def _check_not_wrapped(model: Any) -> None:
    if not isinstance(model, nn.Module):
        raise TorchkilnError(
            f"torchkiln.compile expects a torch.nn.Module, got {type(model).__name__}"
        )
    wrapped_by = {
        "DistributedDataParallel": "DDP",
        "DataParallel": "DataParallel",
        "FullyShardedDataParallel": "FSDP",
        "DeepSpeedEngine": "DeepSpeed",
        "OptimizedModule": "torch.compile",
    }
    name = type(model).__name__
    if name in wrapped_by:
        raise DistributedError(
            f"the model is already wrapped by {wrapped_by[name]} ({name}); pass the plain module "
            "to torchkiln.compile and let the distributed strategy wrap it "
            "(distributed='ddp' / 'fsdp2' / 'deepspeed')"
        )


def compile(
    model: nn.Module,
    config: ConfigArg = None,
    *,
    plugins: PluginsArg = None,
    **options: Any,
) -> Any:
    """Compile ``model`` region by region, in place.

    :param model: the root module (not yet wrapped by DDP, FSDP or DeepSpeed).
    :param config: a YAML path, a mapping in the YAML shape, or a ``CompileConfig``. By default
        ``$TORCHKILN_CONFIG`` or ``./torchkiln.yaml`` is read when present.
    :param plugins: a :class:`~torchkiln.PluginManager` (default: the process one), or a list
        of plugin objects/modules (a fresh manager with the built-ins and them).
    :param options: ``CompileConfig`` fields (``backend="eager"``, ``regions="whole"``, ...),
        the highest-precedence source.
    :return: ``model`` itself, compiled in place; or, with a distributed strategy, what that
        strategy wraps it in (the DDP module, the FSDP2-sharded model, the DeepSpeed engine).
    :raises ConfigError: bad configuration, before anything is touched.
    """
    _check_not_wrapped(model)
    pm = as_plugin_manager(plugins).ensure_loaded()
    resolved = resolve_config(config, plugins=pm, **options)
    cfg = resolved.config
    if not cfg.enabled:
        logger.info(
            "torchkiln: compilation is off (backend=%r, disable=%r)", cfg.backend, cfg.disable
        )
        if cfg.distributed.strategy == "none":
            return model
    region_plan = (
        _plan(model, resolved, pm)
        if cfg.enabled
        else RegionPlan("none", (), reason="compilation off")
    )
    compiler = Compiler(region_plan, cfg, pm, make_progress(cfg, region_plan))
    if cfg.enabled and cfg.artifacts is not None:
        from torchkiln.precompiled import artifact_hook

        compiler.group_hooks.append(artifact_hook(cfg, pm))
    compile_regions = compiler if cfg.enabled else _skip_compile(compiler)
    result = pm.wrap_distributed(
        model=model,
        config=cfg,
        plan=region_plan,
        strategy=cfg.distributed.strategy,
        compile_regions=compile_regions,
    )
    if compiler.calls != 1:
        raise PluginError(
            f"the {cfg.distributed.strategy!r} strategy called compile_regions {compiler.calls} "
            "times; it must call it exactly once"
        )
    check_result(result, model)
    state = state_of(result.module)
    if state is not None and cfg.cache_dir is not None:
        # Compilation is lazy: pointing the caches there now covers the first call; the
        # process-wide variable is put back by decompile (an explicit, documented option).
        add_undo(result.module, apply_cache_dir(cfg.cache_dir).restore)
    if state is not None and cfg.report:
        state.on_first_calls_done.append(lambda s: print(build_report(s), file=sys.stderr))
    attach(result)  # so unwrap/report/decompile find the module behind the wrapper
    return result.wrapped


def _skip_compile(compiler: Compiler) -> Any:
    def skip(module: nn.Module) -> None:
        compiler.calls += 1

    return skip


def _root(model: Any) -> nn.Module:
    """The plain module behind whatever compile returned."""
    result = distributed_result(model)
    if result is not None:
        return result.module
    return model


def _compiled_state(model: Any) -> CompileState | None:
    return state_of(_root(model))


def is_compiled(model: Any) -> bool:
    """Whether torchkiln compiled ``model`` (or the module inside the returned wrapper)."""
    return _compiled_state(model) is not None


def decompile(model: Any) -> nn.Module:
    """Undo :func:`torchkiln.compile` in place: every region's ``forward`` and every setting
    torchkiln changed is restored. Returns the plain module (unwrapped from DDP/DeepSpeed when
    ``model`` is a wrapper torchkiln returned). A no-op on a module torchkiln did not compile."""
    root = _root(model)
    _decompile_inplace(root)
    return root


def report(model: Any) -> CompileReport:
    """Per region: graphs compiled, compile seconds, graph breaks, recompiles, cache hits and
    any fallback reason, from Dynamo's own records. Meaningful after the first call."""
    state = _compiled_state(model)
    if state is None:
        raise TorchkilnError("this model was not compiled by torchkiln.compile (or was decompiled)")
    return build_report(state)


__all__ = ["STATE_ATTR", "compile", "decompile", "is_compiled", "plan", "report"]
