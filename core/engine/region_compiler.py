"""Compile regions in place and undo it (docs/architecture.md, "Compiling in place").

Each region's ``forward`` becomes an instance attribute: its group's compiled function, made
from a small function with a code object of its own per group (one Dynamo cache per group,
shared by its regions), bound to the module. :mod:`torchkiln.engine.compile_state` keeps what
was there and puts it back; what a region's call does then is
:mod:`torchkiln.engine.group_runtime`'s.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from torch import nn

from torchkiln._internals import dynamo
from torchkiln._internals.hub_kernels import name_function_modules
from torchkiln.configuration.config import CompileConfig
from torchkiln.engine import dynamo_records
from torchkiln.engine.compile_state import (
    MISSING,
    REGION_ATTR,
    STATE_ATTR,
    CompileState,
    RegionState,
    named_tensors,
    ran_eagerly,
    state_of,
)
from torchkiln.engine.double_compile import group_function_check
from torchkiln.engine.dynamo_records import HeldRecords
from torchkiln.engine.group_runtime import CodeSource, GroupCode, with_trace_settings
from torchkiln.engine.progress import ProgressObserver
from torchkiln.engine.region_runtime import (
    FirstCall,
    RegionRuntime,
    describe_failure,
    first_line,
    traceable_int_patch,
)
from torchkiln.engine.saved_guards import saving_config
from torchkiln.engine.states import State
from torchkiln.errors import PluginError, RegionCompileError, TorchkilnError
from torchkiln.plugin_host.group_preparation import GroupPreparation, RegionFunction
from torchkiln.plugin_host.hook_calls import call_implementation, plain_implementations
from torchkiln.plugin_host.plugin_faults import bad_result, plugin_at_fault, raised_in
from torchkiln.plugin_host.region_plan import RegionGroup, RegionPlan


class _PreparedForward(functools.partial):  # type: ignore[type-arg]
    """A preparation's ``functools.partial`` forward (the hierarchical selector's nested
    blocks) that pickles as ``getattr(module, "forward")``, like a compiled region's: its
    function is local to torch's ``nested_compile_region`` and cannot be pickled, and
    ``torch.save`` truncates its file before pickling starts. Loading puts the module's own
    forward back (:func:`_plain_after_load`). Dynamo sees a ``functools.partial``."""

    _torchkiln_module: nn.Module

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (getattr, (self._torchkiln_module, "forward"))


def _picklable(module: nn.Module, forward: Any) -> Any:
    if type(forward) is not functools.partial:
        return forward
    prepared = _PreparedForward(forward.func, *forward.args, **forward.keywords)
    prepared._torchkiln_module = module
    return prepared


def _named_forward(function: Any) -> Any:
    """``function`` renamed ``forward``, so a method bound from it pickles as
    ``getattr(module, "forward")`` (the plain forward when loaded)."""
    if getattr(function, "__name__", None) != "forward":
        with contextlib.suppress(AttributeError, TypeError):
            function.__name__ = "forward"
    return function


_SERIAL = itertools.count()

TRACED_WRAPPERS = "torchkiln_traced_wrappers"
"""A group function's attribute: the names of the ``wrap_traced`` wrappers inside it, in order
(:func:`traced_wrappers`)."""


def traced_wrappers(function: Callable[..., Any]) -> tuple[str, ...]:
    """The ``wrap_traced`` wrappers a group function traces through (``()``: the block's forward
    alone), by qualified name."""
    return tuple(getattr(function, TRACED_WRAPPERS, ()))


def _callable_name(function: Any) -> str:
    name = getattr(function, "__qualname__", None) or type(function).__qualname__
    return f"{getattr(function, '__module__', None) or type(function).__module__}.{name}"


def group_function(group: RegionGroup, forward: Callable[..., Any]) -> Callable[..., Any]:
    """``fn(module, *args, **kwargs) -> forward(module, ...)`` with a code object of its own.

    ``forward`` may be wrapped already (``GroupPreparation.wrap_traced``): the function made
    here is the outermost frame, so each group still gets a code object, and a cache, of its own.
    For a group of several regions, module int attributes (``layer_idx``) are traced as
    symbolic (see :func:`~torchkiln.engine.region_runtime.first_call_dynamo_settings`).
    """
    region_forward = _traced_function(
        forward, group.name, unspec_ints=len(group.regions) > 1 and traceable_int_patch()
    )
    # Unique in the process, not just in the model: the report recognises its group's compile
    # records by this name, and two models with a LlamaDecoderLayer group must not mix them.
    name = (
        "torchkiln_" + "".join(c if c.isalnum() else "_" for c in group.name) + f"_{next(_SERIAL)}"
    )
    region_forward.__code__ = region_forward.__code__.replace(co_name=name, co_qualname=name)
    region_forward.__name__ = region_forward.__qualname__ = name
    return region_forward


def instance_forward_function(
    previous: Callable[..., Any], preparations: list[GroupPreparation], group_name: str
) -> Callable[..., Any]:
    """For a module whose ``forward`` was already replaced on the instance (autocast wrappers)."""

    def previous_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        return previous(*args, **kwargs)

    return _traced_function(
        _wrapped(previous_forward, preparations, "wrap_traced"), group_name, False
    )


def _traced_function(
    forward: Callable[..., Any], group_name: str, unspec_ints: bool
) -> Callable[..., Any]:
    """``region_forward(module, *args, **kwargs)``, the frame Dynamo traces, around ``forward``.

    ``comptime(check)`` does something only while Dynamo traces the function (compiled code
    does not contain it): it reports another compile inlining this region, a double compile
    (:mod:`torchkiln.engine.double_compile`). ``is_compiling()`` is folded away by Dynamo, so
    only eager runs count themselves (:func:`ran_eagerly`).
    """
    from torch.compiler import is_compiling

    comptime = dynamo.comptime_function()  # imported with Dynamo, not with torchkiln
    check = group_function_check(group_name)
    if unspec_ints:
        patch_dynamo_config = dynamo.traced_config_patcher()

        def region_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            comptime(check)
            if not is_compiling():
                ran_eagerly(locals())
            with patch_dynamo_config(allow_unspec_int_on_nn_module=True):
                return forward(module, *args, **kwargs)

    else:

        def region_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            comptime(check)
            if not is_compiling():
                ran_eagerly(locals())
            return forward(module, *args, **kwargs)

    return region_forward


class Compiler:
    """Compiles one plan's regions in place."""

    def __init__(
        self, plan: RegionPlan, config: CompileConfig, plugins: Any, progress: ProgressObserver
    ):
        self.plan = plan
        self.config = config
        self.plugins = plugins
        self.progress = progress
        self.calls = 0
        self.sources: list[CodeSource] = []
        """Where a group's code may come from before the backend compiles it, in order (the
        store or a peer rank, a precompiled directory): :class:`GroupCode` asks them."""

    def __call__(self, root: nn.Module) -> None:
        """The ``compile_regions`` callback handed to ``wrap_distributed``."""
        self.calls += 1
        if self.calls > 1:
            strategy = self.config.distributed.strategy
            declared = self.plugins.distributed_strategies().get(strategy)
            plugin = declared.plugin if declared is not None else None
            who = f"plugin {plugin!r} (strategy {strategy!r})" if plugin else "a plugin"
            raise PluginError(
                f"{who} called compile_regions twice in wrap_distributed(); it must call it "
                "exactly once",
                plugin=plugin,
                hook="wrap_distributed",
            )
        if state_of(root) is not None:
            raise TorchkilnError(
                "this model is already compiled by torchkiln; call torchkiln.decompile(model) first"
            )
        # Before any trace: code that calls a Hugging Face kernels function module can then be
        # saved (region entries, precompiled and whole-model forms; _internals.hub_kernels).
        name_function_modules(type(module).__module__ for module in root.modules())
        state = CompileState(
            self.plan,
            self.config,
            tagged_before=frozenset(
                name
                for name, tensor in named_tensors(root)
                if dynamo.has_static_address_tag(tensor)
            ),
            pending=self.plan.region_count,
            records_before=HeldRecords.now(),
            root=weakref.ref(root),
        )
        dynamo_records.install()
        object.__setattr__(root, STATE_ATTR, state)
        for index, group in enumerate(self.plan.groups):
            preparations = self._prepare(root, state, group)
            self._compile_group(state, index, group, preparations)

    def _prepare(
        self, root: nn.Module, state: CompileState, group: RegionGroup
    ) -> list[GroupPreparation]:
        """Ask every plugin to prepare ``group``; install their forwards, keep their undos."""
        preparations = []
        # One plugin's preparation at a time (each inside every wrapper of the hook), so that a
        # fault names the plugin it came from.
        for impl in plain_implementations(self.plugins, "prepare_group"):
            try:
                preparation = call_implementation(
                    self.plugins,
                    "prepare_group",
                    impl,
                    model=root,
                    plan=self.plan,
                    group=group,
                    config=self.config,
                    layer_caches=self.plugins.layer_caches(),
                )
            except TorchkilnError:
                raise
            except Exception as error:
                raise raised_in(self.plugins, "prepare_group", error, impl.plugin_name) from error
            if preparation is None:
                continue
            if not isinstance(preparation, GroupPreparation):
                expected = f"torchkiln.plugin.GroupPreparation or None (group {group.name!r})"
                raise bad_result("prepare_group", impl.plugin_name, preparation, expected)
            preparations.append(preparation)
        for preparation in preparations:
            for module, forward in preparation.forwards:
                state.replaced_forwards.append((module, module.__dict__.get("forward", MISSING)))
                if forward is None:
                    module.__dict__.pop("forward", None)
                else:
                    module.__dict__["forward"] = _picklable(module, forward)
            state.notes.extend(f"{group.name}: {note}" for note in preparation.notes)
            if preparation.undo is not None:
                state.restore.append(preparation.undo)
        return preparations

    def _compile_group(
        self,
        state: CompileState,
        index: int,
        group: RegionGroup,
        preparations: list[GroupPreparation],
    ) -> None:
        traced = _wrapped(type(group.regions[0].module).forward, preparations, "wrap_traced")
        shared = group_function(group, traced)
        # What else the traced code runs besides the block's forward (activation checkpointing,
        # say): part of a saved entry's key, so an entry never serves a group traced otherwise.
        shared.__dict__[TRACED_WRAPPERS] = tuple(
            _callable_name(p.wrap_traced) for p in preparations if p.wrap_traced is not None
        )
        state.code_names[group.name] = shared.__code__.co_name
        state.codes[group.name] = shared.__code__
        sources = [source for source in self.sources if source.attach(group, shared)]
        compiled_shared, error = (
            (self._group_code(shared, group, preparations, sources), None)
            if sources
            else self._compile(shared, group, preparations)
        )
        if isinstance(compiled_shared, GroupCode):
            state.group_codes[group.name] = compiled_shared
        check = None
        if error is None:
            compiled_shared, check = _wrap_call(compiled_shared, preparations, group.name)
        compiled_shared = _named_forward(compiled_shared)  # once per group, not per region
        first_calls: dict[str, FirstCall] = {}
        for region in group.regions:
            module = region.module
            region_state = RegionState(
                region, index, module, module.__dict__.get("forward", MISSING), owner=state
            )
            state.regions.append(region_state)
            object.__setattr__(module, REGION_ATTR, region_state)
            if error is not None:
                state.set_status(region_state, State.EAGER)
                region_state.fallback_reason = (
                    f"compile_region failed: {type(error).__name__}: {first_line(error)}"
                )
                continue
            compiled, wrapper_code, own_check = compiled_shared, shared.__code__.co_name, check
            if region_state.previous_forward is not MISSING:
                # A per-instance forward (an autocast wrapper, say) is compiled on its own.
                own = instance_forward_function(
                    region_state.previous_forward, preparations, group.name
                )
                compiled, own_error = self._compile(own, group, preparations)
                own_check = None
                if own_error is None:
                    compiled, own_check = _wrap_call(compiled, preparations, group.name)
                compiled = _named_forward(compiled)
                wrapper_code = own.__code__.co_name
            first_call = first_calls.get(wrapper_code)
            if first_call is None:
                first_call = first_calls[wrapper_code] = FirstCall(
                    group,
                    len(self.plan.groups),
                    wrapper_code,
                    self.progress,
                    self.config.on_region_error,
                    self._backend_plugin,
                    state.group_codes.get(group.name) if compiled is compiled_shared else None,
                )
            module.__dict__["forward"] = RegionRuntime(
                region_state, compiled, first_call, own_check
            )

    @functools.cached_property
    def _backend_plugin(self) -> str | None:
        """The plugin that declared the configured backend (``None``: torch's own)."""
        declared = self.plugins.backend(self.config.backend)
        return declared.plugin if declared is not None and declared.plugin != "torch" else None

    def _group_code(
        self,
        fn: RegionFunction,
        group: RegionGroup,
        preparations: list[GroupPreparation],
        sources: list[CodeSource],
    ) -> GroupCode:
        """The group served by its sources' code; the backend compiles only for the calls it
        does not fit (no ``torch.compile`` wrapper, nor the backend's stack, until then)."""

        def compile_group() -> RegionFunction:
            # No wrap_call here: it is around the loaded function, which calls this one.
            compiled, error = self._compile(fn, group, preparations)
            if error is not None:  # the eager policy: the calls that needed it run eagerly
                warnings.warn(
                    f"torchkiln: group {group.name!r} runs eagerly for the calls its loaded "
                    f"function does not fit: {describe_failure(error)}",
                    RuntimeWarning,
                    stacklevel=2,
                )
            return compiled

        def compile_savable(dynamic: bool | None = None) -> Any:
            # What torch can save: the group's function under saving_config (fullgraph, the
            # guards torch cannot save dropped where the key covers them), in the
            # preparations' trace settings.
            config = saving_config(self.config, dynamic)
            compiled = self.plugins.compile_region(
                fn=fn, group=group, config=config, backend=config.backend
            )
            return with_trace_settings(compiled, preparations)

        return GroupCode(group, fn, sources, compile_group, compile_savable)

    def _compile(
        self,
        fn: RegionFunction,
        group: RegionGroup,
        preparations: list[GroupPreparation],
    ) -> tuple[RegionFunction, BaseException | None]:
        """The group's compiled function (inside its trace settings, before any ``wrap_call``:
        the caller adds those), or (under the ``eager`` policy) ``fn`` and the error.

        A plugin raising, answering nothing for its own backend, or returning something that
        is not callable all fail here, at compile time, by the region error policy."""
        try:
            compiled = self.plugins.compile_region(
                fn=fn, group=group, config=self.config, backend=self.config.backend
            )
            if not callable(compiled):
                raise bad_result("compile_region", self._backend_plugin, compiled, "a callable")
        except Exception as error:
            plugin = plugin_at_fault(self.plugins, "compile_region", error) or self._backend_plugin
            if self.config.on_region_error == "raise":
                raise RegionCompileError(
                    group.regions[0].path, group.name, error, plugin
                ) from error
            return fn, error
        code_name = fn.__code__.co_name
        if code_name.startswith(dynamo_records.GROUP_CODE_PREFIX):
            # Entered while Dynamo compiles the group's code, not on every call of it.
            factories = [p.trace_settings for p in preparations if p.trace_settings is not None]
            dynamo_records.trace_while_compiling(code_name, factories)
            return compiled, None
        return with_trace_settings(compiled, preparations), None  # an instance forward's


def _wrapped(
    function: RegionFunction, preparations: list[GroupPreparation], wrapper: str
) -> RegionFunction:
    """``function`` inside every preparation's ``wrapper`` (``wrap_traced`` or ``wrap_call``),
    the first preparation's outermost."""
    for preparation in reversed(preparations):
        wrap = getattr(preparation, wrapper)
        if wrap is not None:
            function = wrap(function)
    return function


def _wrap_call(
    compiled: RegionFunction, preparations: list[GroupPreparation], group: str
) -> tuple[RegionFunction, Callable[[Any], None] | None]:
    """``compiled`` inside every ``wrap_call`` wrapper, the first preparation's outermost, and
    the double-compile check its region's runtime starts with (``None``: no wrapper).

    A wrapper runs eagerly, before the group's compiled function, so an outer compile (a double
    compile) traces it first; where it breaks the outer graph there (torch 2.15 does not resume
    into the group function after a break in a nested frame), the group function's own check
    is never traced. So the region's runtime, the frame in front of the outermost wrapper,
    starts with the same check (:class:`RegionRuntime`), with no frame of its own."""
    wrapped = _wrapped(compiled, preparations, "wrap_call")
    if wrapped is compiled:
        return compiled, None
    return wrapped, group_function_check(group)
