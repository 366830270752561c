"""The torchkiln hook specifications.

``torchkiln.compile(model)`` runs four pipeline hooks, in this order::

    resolve_compile_config -> select_regions -> wrap_distributed -> compile_region (per group)

Inside ``wrap_distributed``'s ``compile_regions`` callback, each region group is first offered
to :func:`prepare_group`, then compiled by :func:`compile_region` (once per group, not once per
region). Four declaration hooks say what a plugin provides (backends, selectors, distributed
strategies, caches kept per layer). Plugin authors import everything from
:mod:`torchkiln.plugin` and implement a hook with ``@hookimpl`` on a function of the same name;
implementations may accept any subset of the arguments shown. docs/hooks.md says how plugins
are registered and in what order their implementations are called.

Every hook may be wrapped: ``@hookimpl(wrapper=True)`` (or pluggy's older
``@hookimpl(hookwrapper=True)``) on a generator function of the hook's name, which yields once
and receives the result. torchkiln calls each hook through pluggy, one plain implementation at
a time (the declaring plugin's for a name-served hook, each plugin's in turn for the hooks it
combines), every call inside every wrapper: a wrapper sees each call's arguments and that
implementation's result (the type documented below, not a list), and what it returns is the
result torchkiln uses. docs/hooks.md, "Wrapping a hook", has an example.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from torch import nn

    from torchkiln.configuration.config import CompileConfig
    from torchkiln.plugin_host.declarations import (
        BackendSpec,
        DistributedSpec,
        LayerCacheSpec,
        SelectorSpec,
    )
    from torchkiln.plugin_host.distributed_result import DistributedResult
    from torchkiln.plugin_host.group_preparation import GroupPreparation
    from torchkiln.plugin_host.region_plan import RegionGroup, RegionPlan

PROJECT_NAME = "torchkiln"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


# --- declaration hooks ------------------------------------------------------------------------


@hookspec
def declare_backends() -> Sequence[BackendSpec]:
    """Declare the compile backends this plugin provides.

    :return: the plugin's :class:`~torchkiln.plugin.BackendSpec` objects (possibly empty).

    Fires: whenever torchkiln needs the backend registry (validating ``backend``, listing
    plugins), at most once per plugin manager until plugins change.

    Combination: every implementation is called and the lists are concatenated. Two plugins
    declaring the same name is reported (a warning naming both plugins and the name); the
    plugin called first wins: registered plugins over installed (entry-point) ones over
    built-ins, whatever the order of registration; ``tryfirst``/``trylast`` move a plugin
    within that order.

    A backend carries its compile (:attr:`~torchkiln.plugin.BackendSpec.compile`), which
    torchkiln calls through :func:`compile_region`. A declaration without one (plugin API v2)
    is compiled by the declaring plugin's own :func:`compile_region`; a plugin that declares
    such backends without implementing it is warned about (refused under
    ``TORCHKILN_STRICT_PLUGINS=1``) when it is registered or loaded.
    """


@hookspec
def declare_selectors() -> Sequence[SelectorSpec]:
    """Declare the selectors (values of ``regions.strategy``) this plugin provides.

    :return: the plugin's :class:`~torchkiln.plugin.SelectorSpec` objects.

    Fires and combines like :func:`declare_backends`. The declaring plugin must answer
    :func:`select_regions` for each name it declares.
    """


@hookspec
def declare_distributed() -> Sequence[DistributedSpec]:
    """Declare the distributed strategies (values of ``distributed.strategy``) this plugin
    provides.

    :return: the plugin's :class:`~torchkiln.plugin.DistributedSpec` objects.

    Fires and combines like :func:`declare_backends`. The declaring plugin must answer
    :func:`wrap_distributed` for each name it declares.
    """


@hookspec
def declare_layer_caches() -> Sequence[LayerCacheSpec]:
    """Declare caches that a model keeps per layer, so that each compiled block gets its own
    layer's entry and one graph serves every depth.

    :return: the plugin's :class:`~torchkiln.plugin.LayerCacheSpec` objects: a cache class,
        the attribute holding its per-layer list, the methods that take a layer index, the
        attribute names blocks keep their index in, and the block parameter the cache comes in.

    Fires: once per plugin manager until plugins change, when a group is prepared (the
    declarations are handed to :func:`prepare_group` as ``layer_caches``).

    Combination: every implementation is called and the lists are concatenated, the plugin
    called first first (registered plugins, then installed ones, then built-ins). For a cache
    object, the first declaration whose ``cache_type`` it is an instance of applies, so a
    plugin's declaration for a subclass of transformers' ``Cache`` wins over the built-in one
    for ``Cache``. ``index_attributes`` of every declaration are tried for every block. Two
    declarations with the same ``name`` are reported like two backends with one name.

    The built-in adapter (``torchkiln.transformers_models``) declares transformers' ``Cache``
    and applies the declarations; a plugin needs no other hook to support its own cache
    (``docs/generation.md``, "A model family torchkiln does not know").
    """


# --- pipeline hooks ---------------------------------------------------------------------------


@hookspec
def resolve_compile_config(
    config: CompileConfig, sources: Mapping[str, str]
) -> Mapping[str, Any] | None:
    """Adjust the configuration after defaults, file, environment and keyword options merged.

    :param config: the validated configuration so far.
    :param sources: where each field came from, by dotted field path (``backend``,
        ``regions.strategy``) to ``default``, ``file:PATH``, ``env:NAME`` or ``argument``. Use it
        to leave alone what the user set explicitly.
    :return: ``None`` for no change, or a nested mapping of field overrides in the same shape
        as the YAML file (``{"backend": "eager", "regions": {"strategy": "whole"}}``).

    Fires: first in :func:`torchkiln.compile`, :func:`torchkiln.plan` and ``torchkiln config
    show``, once per call.

    Combination: every implementation is called with the same ``config``; their overrides are
    merged and validated together, and each overridden field's source becomes
    ``plugin:NAME``. When two plugins set the same field, the one called first wins and a
    warning names both. A bad override raises :class:`~torchkiln.ConfigError` naming the plugin.
    """


@hookspec
def select_regions(model: nn.Module, config: CompileConfig, selector: str) -> RegionPlan:
    """Decide which submodules of ``model`` are compiled, grouped by shared compiled code.

    :param model: the root module, not yet wrapped by any distributed engine.
    :param config: the resolved configuration (``config.regions`` holds the selector options).
    :param selector: the requested selector name (``config.regions.strategy``, lower case):
        always one this plugin declared.
    :return: a :class:`~torchkiln.plugin.RegionPlan`.

    Fires: once per :func:`torchkiln.compile` / :func:`torchkiln.plan`, after configuration.

    Dispatch: only the implementation of the plugin that declared ``selector`` is called, so an
    implementation needs no ``if selector != ...: return None``. A selector must not
    fall back to another selector silently: a plan whose ``selector`` differs from the request
    says why in ``reason`` (torchkiln logs it).
    """


@hookspec
def wrap_distributed(
    model: nn.Module,
    config: CompileConfig,
    plan: RegionPlan,
    strategy: str,
    compile_regions: Callable[[nn.Module], None],
) -> DistributedResult:
    """Wrap ``model`` for a distributed engine, compiling its regions at the right moment.

    :param model: the root module.
    :param config: the resolved configuration (``config.distributed`` holds the options).
    :param plan: the region plan for ``model``.
    :param strategy: the requested strategy name: always one this plugin declared.
    :param compile_regions: call exactly once with the module that holds the plan's regions
        (``model`` itself, or the engine's module). It compiles every region in place, through
        :func:`compile_region`. DDP calls it before wrapping; FSDP2 after activation
        checkpointing and before ``fully_shard``; DeepSpeed after ``deepspeed.initialize``.
    :return: a :class:`~torchkiln.plugin.DistributedResult`.

    Fires: once per :func:`torchkiln.compile`, after :func:`select_regions`.

    Dispatch: only the declaring plugin's implementation is called. torchkiln raises if it did not call
    ``compile_regions`` exactly once, or if ``model`` is already wrapped by an engine.
    """


@hookspec
def prepare_group(
    model: nn.Module,
    plan: RegionPlan,
    group: RegionGroup,
    config: CompileConfig,
    layer_caches: Sequence[LayerCacheSpec],
) -> GroupPreparation | None:
    """Prepare one region group before :func:`compile_region` compiles it.

    :param model: the module that holds the plan's regions (what ``compile_regions`` got).
    :param plan: the whole region plan (``plan.selector`` says which selector made it).
    :param group: the group about to be compiled; its modules are
        ``group.regions[i].module``, and ``group.nested`` holds blocks a selector marked inside.
    :param config: the resolved configuration.
    :param layer_caches: every plugin's :func:`declare_layer_caches` declarations, in hook
        order (what the built-in cache adapter applies).
    :return: a :class:`~torchkiln.plugin.GroupPreparation` (wrap the traced function, wrap the
        compiled one, install forwards on submodules, an undo action), or ``None`` to leave the
        group alone.

    Fires: once per group, inside ``compile_regions``, just before :func:`compile_region`.

    Combination: every implementation is called, in hook order; every preparation returned is
    applied. Wrappers compose with the first implementation called outermost. Everything a
    preparation installs is undone by :func:`torchkiln.decompile`, in reverse order.
    Do not change the model here: say what to change in the returned preparation.
    """


@hookspec
def compile_region(
    fn: Callable[..., Any], group: RegionGroup, config: CompileConfig, backend: str
) -> Callable[..., Any]:
    """Compile the shared forward function of one region group.

    :param fn: ``fn(module, *args, **kwargs)`` runs one region's original ``forward`` (inside
        any ``wrap_traced`` wrappers from :func:`prepare_group`). It is a fresh function object
        with its own code object per group, so Dynamo keeps one cache per group, shared by every
        region in it.
    :param group: the regions that will call the result (``group.regions[i].module``).
    :param config: the resolved configuration (``mode``, ``fullgraph``, ``dynamic``,
        ``options``).
    :param backend: the configured backend name, lower case: always one this plugin declared.
    :return: a callable with ``fn``'s signature (typically
        ``torchkiln.plugin.compile_with_torch(fn, config, backend=...)``).

    Fires: once per group (not per region: every region of the group shares the result),
    inside ``compile_regions`` (see :func:`wrap_distributed`), after :func:`prepare_group`.
    Compilation itself is lazy: the returned callable compiles on a region's first call.

    Dispatch: one implementation per call, inside every wrapper of this hook: the backend's own
    compile (``BackendSpec.compile``, run as the declaring plugin's implementation), else the
    declaring plugin's implementation of this hook. For a name no plugin declares but torch
    knows (``torch._dynamo.list_backends()``), the implementation is ``torch.compile`` with the
    configured options. So a wrapper of this hook sees every group's compile, whatever the
    backend.
    An exception raised here is handled by the region error policy (``on_region_error``).
    """
