"""The public pipeline: ``compile``, ``plan``, ``decompile``, ``is_compiled``, ``report``."""

from __future__ import annotations

import copy
import logging
import sys
from collections.abc import Callable
from typing import Any

import attrs
import torch
from torch import nn

from torchkiln.artifacts.cache import apply_cache_dir, check_cache_dir
from torchkiln.configuration.config import CompileConfig
from torchkiln.configuration.store_layout import tiers_implied
from torchkiln.distributed import attach, check_result, distributed_result, strategy_owner
from torchkiln.engine.adapter_placement import warn_adapters_outside_blocks
from torchkiln.engine.compile_state import (
    STATE_ATTR,
    CompileState,
    add_undo,
    decompile_held,
    held_regions,
    state_of,
)
from torchkiln.engine.compile_state import decompile as _decompile_inplace
from torchkiln.engine.plan_check import answered, select_plan
from torchkiln.engine.progress import make_progress
from torchkiln.engine.region_compiler import Compiler
from torchkiln.engine.resolve import ConfigArg, resolve_config
from torchkiln.engine.transaction import Snapshot
from torchkiln.errors import DistributedError, PluginError, RegionCompileError, TorchkilnError
from torchkiln.plugin_host.declarations import BackendSpec, DistributedSpec, SelectorSpec
from torchkiln.plugin_host.default_manager import PluginsArg, as_plugin_manager
from torchkiln.plugin_host.distributed_result import DistributedResult
from torchkiln.plugin_host.plugin_faults import bad_result, shown
from torchkiln.plugin_host.plugin_manager import Declared, PluginManager
from torchkiln.plugin_host.region_plan import RegionPlan
from torchkiln.plugin_host.report_causes import ReportCause
from torchkiln.reporting.compile_report import CompileReport, build_report

logger = logging.getLogger("torchkiln")


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
    return select_plan(model, resolve_config(config, plugins=pm, **options), pm)


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
    # From the first hook on (plugins may hold the model, or change process-wide settings), a
    # failure puts the model and the process back exactly as they were; what cannot be put
    # back, parameter values written in place, is named.
    snapshot = Snapshot.take(model)
    try:
        return _compile_all(model, config, plugins, options)
    except BaseException as error:
        try:
            _decompile_inplace(model)  # releases process-wide settings the model held
        finally:
            snapshot.restore()
        if isinstance(error, Exception) and (changed := snapshot.changed_values()):
            raise _values_changed(error, changed) from error
        raise


def _compile_all(
    model: nn.Module, config: ConfigArg, plugins: PluginsArg, options: dict[str, Any]
) -> Any:
    pm = as_plugin_manager(plugins).ensure_loaded()
    resolved = resolve_config(config, plugins=pm, **options)
    cfg = resolved.config
    if not cfg.enabled:
        logger.info("compilation is off (backend=%r, disable=%r)", cfg.backend, cfg.disable)
        if cfg.distributed.strategy == "none":
            return model
        return _compile_checked(
            model, cfg, RegionPlan("none", (), reason="compilation off"), pm, []
        )
    region_plan = select_plan(model, resolved, pm)
    notes = warn_adapters_outside_blocks(model, region_plan)
    if cfg.cache_dir is not None:
        check_cache_dir(cfg.cache_dir)
    if cfg.tiered.enabled and tiers_implied(resolved.sources):
        cfg = _keep_implied_tiers(cfg, region_plan, pm)
    if cfg.tiered.enabled:
        from torchkiln.tiered.install import check_plan_for_tiers

        check_plan_for_tiers(region_plan)
    return _compile_checked(model, cfg, region_plan, pm, notes)


def _keep_implied_tiers(cfg: CompileConfig, region_plan: RegionPlan, pm: PluginManager) -> Any:
    """``cfg``, with the tiers a store implied turned off where they cannot run (a plan they
    cannot build on, a backend that cannot save): the store still keeps what it can."""
    from torchkiln.tiered.install import check_plan_for_tiers

    declared = pm.backend(cfg.backend)
    if declared is None or not getattr(declared.spec, "precompile", False):
        problem = f"backend {cfg.backend!r} cannot save a whole-model form"
    else:
        try:
            check_plan_for_tiers(region_plan)
            return cfg
        except TorchkilnError as error:
            problem = str(error)
    logger.info("store %s: no whole-model tier for this model: %s", cfg.store, problem)
    return attrs.evolve(cfg, tiered=attrs.evolve(cfg.tiered, enabled=False))


def _values_changed(error: Exception, changed: list[str]) -> PluginError:
    """The error for a failed compile after which parameter or buffer values differ: they were
    written in place by the plugin that failed (or one before it), and cannot be restored."""
    plugin, hook = getattr(error, "plugin", None), getattr(error, "hook", None)
    if isinstance(error, RegionCompileError):
        hook = "compile_region"
    who = f"plugin {plugin!r}" if plugin else "a plugin"
    where = f" in {hook}()" if hook else ""
    shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
    return PluginError(
        f"{who} wrote the values of {shown}{where} and then the compile failed; everything "
        "else was put back, but torchkiln keeps no copy of the weights, so these cannot be: "
        f"reload them. The failure: {error}",
        plugin=plugin,
        hook=hook,
    )


def _compile_checked(
    model: nn.Module,
    cfg: CompileConfig,
    region_plan: RegionPlan,
    pm: PluginManager,
    notes: list[str],
) -> Any:
    compiler = Compiler(region_plan, cfg, pm, make_progress(cfg, region_plan))
    job_share = job_report = None
    if cfg.enabled:
        from torchkiln.jobs import job_share_for

        if cfg.artifacts is not None:
            from torchkiln.jobs.precompiled import PrecompiledDirectory

            source = PrecompiledDirectory(cfg.artifacts, cfg.artifacts_strict, cfg, pm)
            compiler.sources.append(source)
        job_share, job_report = job_share_for(cfg, region_plan, pm, cfg.progress != "off")
        if job_share is not None:
            compiler.sources.append(job_share)
    compile_regions = compiler if cfg.enabled else _skip_compile(compiler)
    strategy = cfg.distributed.strategy
    declared = pm.distributed_strategies().get(strategy)
    owner = declared.plugin if declared is not None else None
    result = answered(
        pm,
        "wrap_distributed",
        owner,
        strategy,
        model=model,
        config=cfg,
        plan=region_plan,
        strategy=strategy,
        compile_regions=compile_regions,
    )
    if not isinstance(result, DistributedResult):
        raise bad_result("wrap_distributed", owner, result, "a torchkiln.DistributedResult")
    if compiler.calls != 1:
        raise PluginError(
            f"{strategy_owner(owner, strategy)} called compile_regions {compiler.calls} times in "
            "wrap_distributed(); it must call it exactly once",
            plugin=owner,
            hook="wrap_distributed",
        )
    check_result(result, model, owner)
    state = state_of(result.module)
    if state is not None:
        state.job = job_share if job_share is not None else job_report
        state.report_causes = declared_causes(pm)
        state.providers = providers(pm, cfg)
        state.notes.extend(notes)
        for step in STEPS:
            if step.wanted(cfg, state):
                undo = step.install(result.module, state, cfg)
                if undo is not None:
                    add_undo(result.module, undo)
    attach(result)  # so unwrap/report/decompile find the module behind the wrapper
    return result.wrapped


@attrs.frozen
class Step:
    """One feature installed on a compiled model after ``wrap_distributed``, in order; what
    ``install`` returns is undone by ``decompile`` (in reverse order)."""

    name: str
    wanted: Callable[[CompileConfig, CompileState], bool]
    install: Callable[[nn.Module, CompileState, CompileConfig], Callable[[], None] | None]


def _cache_dir(model: nn.Module, state: CompileState, cfg: CompileConfig) -> Any:
    # Compilation is lazy: pointing the caches there now covers the first call; the
    # process-wide variable is put back by decompile (an explicit, documented option).
    assert cfg.cache_dir is not None
    return apply_cache_dir(cfg.cache_dir).restore


def _remote_cache(model: nn.Module, state: CompileState, cfg: CompileConfig) -> Any:
    from torchkiln.artifacts.remote_cache import apply_remote_cache

    assert cfg.remote_cache is not None
    state.remote_cache = apply_remote_cache(cfg.remote_cache)
    return state.remote_cache.restore


def _print_report(model: nn.Module, state: CompileState, cfg: CompileConfig) -> None:
    state.on_first_calls_done.append(
        lambda s: print(build_report(s, causes=s.report_causes), file=sys.stderr)
    )


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


def _step_marker(model: nn.Module, state: CompileState, cfg: CompileConfig) -> Any:
    """Mark a CUDA-graph step before each inference call of ``model`` with gradients off and
    parameters on a CUDA device: each block is a compiled function of its own, so unmarked,
    CUDA-graph trees start a step per block and refuse the previous block's output (``mode``
    in docs/configuration.md). Marking is process-wide in torch: a loop that then runs only
    *other* CUDA-graph models should mark its own steps, as torch documents.
    """

    def mark_step(module: nn.Module, args: Any) -> None:
        if not torch.is_grad_enabled() and _on_cuda(module):
            torch.compiler.cudagraph_mark_step_begin()

    return model.register_forward_pre_hook(mark_step).remove


def _tiers(model: nn.Module, state: CompileState, cfg: CompileConfig) -> None:
    from torchkiln.tiered.install import install_tiers

    install_tiers(model, state, cfg)  # when asked for, or a whole-model form exists; its own undo


STEPS: tuple[Step, ...] = (
    Step("cache_dir", lambda cfg, state: cfg.cache_dir is not None, _cache_dir),
    Step("remote_cache", lambda cfg, state: cfg.remote_cache is not None, _remote_cache),
    Step(
        "CUDA graph step marker",
        lambda cfg, state: cfg.enabled and state.plan.region_count > 1 and uses_cuda_graphs(cfg),
        _step_marker,
    ),
    Step("report at the first calls' end", lambda cfg, state: cfg.report, _print_report),
    Step("tiers", lambda cfg, state: True, _tiers),
)
"""What :func:`compile` installs after ``wrap_distributed``, in order (docs/architecture.md)."""


def providers(pm: PluginManager, config: CompileConfig) -> dict[str, str]:
    """Which plugin serves the configured backend and selector (``torch`` for a backend only
    torch's registry knows): the report names them, so a name another plugin took over is
    never mistaken for the one the user meant."""
    backend = pm.backend(config.backend)
    found = {"backend": backend.plugin if backend is not None else None}
    selector = pm.selectors().get(config.regions.strategy)
    found["selector"] = selector.plugin if selector is not None else None
    return {role: plugin for role, plugin in found.items() if plugin is not None}


def declared_causes(pm: PluginManager) -> tuple[ReportCause, ...]:
    """Every ``ReportCause`` the plugins' declarations carry (backends, selectors, strategies),
    in declaration order; anything else there is the declaring plugin's fault."""
    causes: list[ReportCause] = []
    declarations: list[Declared[Any]] = [
        *pm.backends(include_torch=False).values(),
        *pm.selectors().values(),
        *pm.distributed_strategies().values(),
    ]
    hooks = {
        BackendSpec: "declare_backends",
        SelectorSpec: "declare_selectors",
        DistributedSpec: "declare_distributed",
    }
    for declared in declarations:
        found = getattr(declared.spec, "report_causes", ())
        if not isinstance(found, tuple | list) or not all(
            isinstance(c, ReportCause) for c in found
        ):
            raise PluginError(
                f"plugin {declared.plugin!r} declared {declared.spec.name!r} with report_causes "
                f"{shown(found)}; expected a tuple of torchkiln.plugin.ReportCause",
                plugin=declared.plugin,
                hook=hooks.get(type(declared.spec)),
            )
        causes.extend(c for c in found if c not in causes)
    return tuple(causes)


def _skip_compile(compiler: Compiler) -> Any:
    def skip(module: nn.Module) -> None:
        compiler.calls += 1

    return skip


def _root(model: Any) -> nn.Module:
    """The plain module behind whatever compile returned."""
    result = distributed_result(model)
    return result.module if result is not None else model


def is_compiled(model: Any) -> bool:
    """Whether torchkiln compiled ``model`` (or the module inside the returned wrapper), or
    ``model`` holds blocks torchkiln compiled (PEFT's merged model, a submodule taken out of
    the model, a model another library wrapped)."""
    return state_of(_root(model)) is not None or bool(held_regions(_root(model)))


def decompile(model: Any) -> nn.Module:
    """Undo :func:`torchkiln.compile` in place: every region's ``forward`` and every setting
    torchkiln changed is restored. Returns the plain module (unwrapped from DDP/DeepSpeed when
    ``model`` is a wrapper torchkiln returned). On an object that holds compiled blocks but is
    not the compiled root (PEFT's merged model, a submodule), those blocks are restored, and
    the whole compile is undone when it holds all of them. A no-op on a module holding nothing
    torchkiln compiled."""
    root = _root(model)
    if not _decompile_inplace(root):
        decompile_held(root)
    return root


def report(model: Any, *, verbose: bool = False) -> CompileReport:
    """Per region: graphs compiled, compile seconds, graph breaks, recompiles, cache hits,
    recompile-limit hits and any fallback reason, from Dynamo's own records, for the first
    calls and every call since (read now, not recorded on the forward path).

    :param verbose: ``str(report)`` shows Dynamo's full text under each one-line reason.
    """
    state = state_of(_root(model)) or _held_state(model)
    return build_report(state, verbose=verbose, causes=state.report_causes)


def freeze(model: Any, *, on_miss: str = "raise") -> Any:
    """Serving mode: from now on Dynamo compiles nothing for ``model``.

    Every call runs a compiled form the model already holds (warm the calls up first); a call
    that none fits raises :class:`~torchkiln.errors.UncoveredCallError` naming the region and
    the guard that failed (``on_miss="raise"``), or runs that region eagerly with one
    ``UncoveredCallWarning`` per group (``on_miss="eager"``). A tiered builder is stopped; a
    whole-model form already loaded keeps serving the calls it fits. ``torchkiln.decompile``
    ends it. Returns ``model``.

    :raises ConfigError: ``on_miss`` is neither ``"raise"`` nor ``"eager"``.
    :raises TorchkilnError: ``model`` holds nothing torchkiln compiled.
    """
    from torchkiln.engine.serving import freeze_state

    state = state_of(_root(model)) or _held_state(model)
    freeze_state(state, on_miss)
    return model


def _held_state(model: Any) -> CompileState:
    """The compile of the blocks ``model`` holds, limited to those blocks (for a report on
    PEFT's merged model, a submodule taken out of the model, a re-wrapped model)."""
    found = list(held_regions(_root(model)).values())
    if not found:
        raise TorchkilnError(
            "this model was not compiled by torchkiln.compile (or was decompiled), and holds "
            "no block torchkiln compiled"
        )
    if len(found) > 1:
        raise TorchkilnError(
            f"this object holds blocks of {len(found)} separate torchkiln compiles; report "
            "each compiled model on its own"
        )
    state, regions = found[0]
    # A view: the same records (later compiles seen by one report are kept for the others).
    view = copy.copy(state)
    view.regions = regions
    return view


__all__ = ["STATE_ATTR", "compile", "decompile", "is_compiled", "plan", "report"]
