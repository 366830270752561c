"""Compile regions in place and undo it.

Each region's ``forward`` becomes an instance attribute: the group's compiled function bound to
the module. ``nn.Module.__call__`` still runs the module's hooks eagerly around it, exactly as
with ``nn.Module.compile()``; the class, attributes, children and ``state_dict()`` keys are
untouched. Unlike ``nn.Module.compile()`` this also compiles ``torch.nn`` built-ins
(``nn.Linear``, ``nn.TransformerEncoderLayer``): Dynamo skips a *top* frame whose code lives in
``torch/nn``, so each group is compiled through a small function of its own (a fresh code
object per group, hence one Dynamo cache per group shared by all of its regions).

The first call of each region goes through a shim that times it, reads Dynamo's records,
applies the region error policy and reports progress; it then installs the compiled function:
``torch.compile``'s, or (``dispatch="direct"``, the default) torchkiln's dispatcher in place of
``torch.compile``'s per-call wrapper (:mod:`torchkiln.dispatch`).
"""

from __future__ import annotations

import contextlib
import copy
import enum
import functools
import itertools
import sys
import time
import types
import warnings
from collections.abc import Callable
from typing import Any

import attrs
import torch
from torch import nn

from torchkiln import compile_events
from torchkiln.config import CompileConfig
from torchkiln.dispatch import DirectDispatch, direct_dispatch_hook
from torchkiln.double_compile import first_call_check, group_function_check
from torchkiln.dynamo_metrics import CompileRecord, MetricsMark, Window
from torchkiln.errors import RegionCompileError, TorchkilnError
from torchkiln.group_preparation import GroupPreparation, RegionFunction
from torchkiln.plugin_faults import bad_result, culprit, raised_in
from torchkiln.progress import ProgressObserver
from torchkiln.region_plan import Region, RegionGroup, RegionPlan
from torchkiln.trace_settings import with_trace_settings

STATE_ATTR = "_torchkiln_compiled"
REGION_ATTR = "_torchkiln_region"
"""Set in each compiled region's ``__dict__`` (its :class:`RegionState`), removed by decompile."""


class _Missing(enum.Enum):
    # An enum member, not object(): copy.deepcopy(model) must keep the sentinel identical, or
    # decompiling the copy installs the copied sentinel as its forward.
    MISSING = "MISSING"


MISSING = _MISSING = _Missing.MISSING
"""``RegionState.previous_forward`` when the module had no instance-level ``forward``."""
DYNAMO_TENSOR_TAG = "_dynamo_static_input_type"
"""Set by Dynamo on every parameter and buffer it traces; decompile removes the ones it set,
or a whole-model pickle (``torch.save(model)``) would differ from the original's."""


@attrs.define(eq=False)
class RegionState:
    """What torchkiln knows about one compiled region."""

    region: Region
    group_index: int
    module: nn.Module | None = attrs.field(default=None, repr=False)
    """The compiled module itself: decompile restores it by identity, wherever it is now."""
    previous_forward: Any = _MISSING
    """The instance-level ``forward`` the module had before, if any (restored by decompile)."""
    status: str = "pending"
    """``pending`` (no first call finished yet), ``compiled``, ``eager`` (fell back),
    ``failed`` (its compile raised under ``on_region_error='raise'``; the next call retries)."""
    fallback_reason: str | None = None
    first_call_seconds: float | None = None
    records: list[CompileRecord] = attrs.Factory(list)
    graphs: int = 0
    graph_breaks: dict[str, int] = attrs.Factory(dict)
    owner: CompileState | None = attrs.field(default=None, repr=False)
    """The root's state this region belongs to (deep copies keep the pair together)."""

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (_nothing, ())  # a pickled model is the plain model (see CompileState)

    def __copy__(self) -> RegionState:
        return attrs.evolve(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> RegionState:
        copied = object.__new__(RegionState)
        memo[id(self)] = copied
        for field in attrs.fields(RegionState):
            object.__setattr__(copied, field.name, copy.deepcopy(getattr(self, field.name), memo))
        return copied


@attrs.define(eq=False)
class CompileState:
    """State kept on the root module (in ``__dict__``, never as a submodule or buffer)."""

    plan: RegionPlan
    config: CompileConfig
    regions: list[RegionState]
    code_names: dict[str, str]
    """Group name -> the co_name of its compiled function (to attribute later recompiles)."""
    replaced_forwards: list[tuple[nn.Module, Any]] = attrs.Factory(list)
    """``(module, previous forward)`` for each forward a group preparation installed on a
    submodule (the hierarchical selector's nested blocks)."""
    restore: list[Callable[[], None]] = attrs.Factory(list)
    """Undo actions for anything set beyond forwards (:func:`add_undo`), run in reverse."""
    on_first_calls_done: list[Callable[[CompileState], None]] = attrs.Factory(list)
    tagged_before: frozenset[str] = frozenset()
    """Parameters and buffers (by name) that carried Dynamo's tag before compiling."""
    pending: int = 0
    """Regions whose first call has not finished (kept as a count: the first calls of N
    regions must cost O(N), not O(N^2))."""
    failed_groups: dict[str, RegionState] = attrs.Factory(dict)
    """Group -> the region where its compile failed under the ``eager`` policy."""
    first_calls_done: bool = False
    codes: dict[str, types.CodeType] = attrs.Factory(dict)
    """Group -> its compiled function's code object (Dynamo's cache entries hang off it)."""
    dispatchers: dict[str, DirectDispatch] = attrs.Factory(dict)
    """Group -> its direct dispatcher (``dispatch="direct"``, groups torch.compile compiled)."""
    report_causes: tuple[Any, ...] = ()
    """Named causes the plugins declared (``ReportCause``), tried before the built-in ones."""
    records_before: MetricsMark | None = None
    """Dynamo's records from before this compile (never this model's)."""
    later_records: dict[str, tuple[str, CompileRecord]] = attrs.Factory(dict)
    """Compile id -> (group, record) of compiles after the first calls, as reports saw them
    (Dynamo keeps only its most recent records)."""
    tiered: Any = None
    """The tiered runtime (:class:`torchkiln.tiered.runtime.TieredForward`), when installed."""

    def settle(self, region_state: RegionState, status: str) -> None:
        """Set a region's status, keeping :attr:`pending` right."""
        self.pending += (status == "pending") - (region_state.status == "pending")
        region_state.status = status

    def __reduce_ex__(self, protocol: Any) -> Any:
        # torch.save(model) opens (and truncates) its file before pickling starts, so refusing
        # here would destroy an existing checkpoint. Instead the pickle holds the plain model:
        # each compiled forward pickles as ``getattr(module, "forward")`` (its function is
        # named ``forward``), and loading ends by putting every region's own forward back.
        pairs = [
            (state.module, state.previous_forward)
            for state in self.regions
            if state.module is not None
        ]
        pairs += list(self.replaced_forwards)
        if self.tiered is not None:
            pairs += self.tiered.installed_pairs()
        return (_plain_after_load, (pairs,))

    def __copy__(self) -> CompileState:
        return attrs.evolve(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> CompileState:
        copied = object.__new__(CompileState)
        memo[id(self)] = copied
        for field in attrs.fields(CompileState):
            object.__setattr__(copied, field.name, copy.deepcopy(getattr(self, field.name), memo))
        return copied


def _nothing() -> None:
    return None


def _plain_after_load(pairs: list[tuple[nn.Module, Any]]) -> None:
    """Run when a pickled compiled model is loaded: the regions (loaded before the root's
    state, which pickles last) get their own forwards back and lose torchkiln's records."""
    for module, previous in pairs:
        module.__dict__.pop(REGION_ATTR, None)
        _restore_forward(module, previous)


def _named_forward(function: Any) -> Any:
    """``function`` renamed ``forward``, so a method bound from it pickles as
    ``getattr(module, "forward")`` (the plain forward when loaded)."""
    if getattr(function, "__name__", None) != "forward":
        with contextlib.suppress(AttributeError, TypeError):
            function.__name__ = "forward"
    return function


def region_state_of(module: Any) -> RegionState | None:
    """The region state of a module torchkiln compiled as a region, else ``None``."""
    return getattr(module, "__dict__", {}).get(REGION_ATTR)


def state_of(model: Any) -> CompileState | None:
    return getattr(model, "__dict__", {}).get(STATE_ATTR)


def add_undo(model: Any, undo: Callable[[], None]) -> bool:
    """Run ``undo`` when ``model`` is decompiled (undo actions run in reverse order of adding,
    after the region forwards are put back).

    For a ``wrap_distributed`` plugin that changes a setting after ``compile_regions``.

    :return: ``False`` (and ``undo`` is not kept) when torchkiln has not compiled ``model``
        (compilation is off, say): then there is nothing to undo with it.
    """
    state = state_of(model)
    if state is None:
        return False
    state.restore.append(undo)
    return True


_SERIAL = itertools.count()


@functools.cache
def traceable_int_patch() -> bool:
    """Whether this torch can set ``allow_unspec_int_on_nn_module`` inside a traced function
    (``torch._dynamo.patch_dynamo_config``): then the setting holds for every trace of a group's
    code, later recompiles included, and never changes process-wide state."""
    try:
        torch._dynamo.patch_dynamo_config(allow_unspec_int_on_nn_module=True)
    except (AttributeError, ValueError):
        return False
    return True


def group_function(
    group: RegionGroup, index: int, forward: Callable[..., Any]
) -> Callable[..., Any]:
    """``fn(module, *args, **kwargs) -> forward(module, ...)`` with a code object of its own.

    ``forward`` may be wrapped already (``GroupPreparation.wrap_traced``): the function made
    here is the outermost frame, so each group still gets a code object, and a cache, of its own.

    For a group of several regions, module int attributes (``layer_idx``) are traced as
    symbolic (see :func:`first_call_dynamo_settings`): a shape change after the first calls
    recompiles once, not once per block up to the recompile limit.

    ``comptime(check)`` does something only while Dynamo traces the function (compiled code
    does not contain it): it reports another compile inlining this region, a double compile
    (:mod:`torchkiln.double_compile`).
    """
    from torch._dynamo.comptime import comptime  # imported with Dynamo, not with torchkiln

    check = group_function_check(group.name)
    if len(group.regions) > 1 and traceable_int_patch():

        def region_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            comptime(check)
            with torch._dynamo.patch_dynamo_config(allow_unspec_int_on_nn_module=True):
                return forward(module, *args, **kwargs)

    else:

        def region_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            comptime(check)
            return forward(module, *args, **kwargs)

    # Unique in the process, not just in the model: the report recognises its group's compile
    # records by this name, and two models with a LlamaDecoderLayer group must not mix them.
    name = (
        "torchkiln_" + "".join(c if c.isalnum() else "_" for c in group.name) + f"_{next(_SERIAL)}"
    )
    region_forward.__code__ = region_forward.__code__.replace(co_name=name, co_qualname=name)
    region_forward.__name__ = region_forward.__qualname__ = name
    return region_forward


def instance_forward_function(
    previous: Callable[..., Any],
    preparations: list[GroupPreparation] | None = None,
    group_name: str = "",
) -> Callable[..., Any]:
    """For a module whose ``forward`` was already replaced on the instance (autocast wrappers)."""

    def previous_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        return previous(*args, **kwargs)

    from torch._dynamo.comptime import comptime

    traced = _wrap_traced(previous_forward, preparations or [])
    check = group_function_check(group_name)

    def region_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        comptime(check)  # see group_function
        return traced(module, *args, **kwargs)

    return region_forward


def first_call_dynamo_settings(shared_by: int) -> Any:
    """Dynamo settings for a region's first (compiling) call only, restored on exit.

    Blocks of one group often differ only in an integer attribute (``layer_idx``). Dynamo
    specialises such attributes by default, so each block would add a recompile and block 9
    onwards would hit the recompile limit and run eagerly. Treating them as symbolic while the
    group's code is traced lets every block reuse one graph. Nothing stays changed afterwards.
    """
    if shared_by < 2 or traceable_int_patch():  # the group function sets it while tracing
        return contextlib.nullcontext()
    return torch._dynamo.config.patch(allow_unspec_int_on_nn_module=True)


def _is_compile_failure(error: BaseException) -> bool:
    import torch._dynamo.exc as dynamo_exc

    return isinstance(error, dynamo_exc.TorchDynamoException | RegionCompileError)


GroupHook = Callable[[RegionGroup, Callable[..., Any], Callable[..., Any]], Callable[..., Any]]
"""``hook(group, group_function, compiled) -> compiled``: called once per group with the
function ``compile_region`` returned for the group's shared function (before any
``GroupPreparation.wrap_call``); what it returns is installed for every region of the group."""

GroupLoader = Callable[[RegionGroup, Callable[..., Any], Callable[[], Any]], Any]
"""``loader(group, group_function, compile_group) -> function or None``: serves a group's
shared function without compiling it (precompiled artifacts). ``compile_group()`` returns the
group's normally compiled function (``compile_region``, then every group hook); the loader
calls it only when a call needs it, so a group it serves builds no ``torch.compile`` wrapper
(nor imports the backend's compile stack) until then. ``None``: the group compiles as usual.
What it returns is installed like a hook's result; errors it raises propagate as they are."""


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
        self.group_hooks: list[GroupHook] = []
        """Each may replace a group's compiled function (precompiled artifacts do). Errors they
        raise propagate as they are (they are not compile failures of the region)."""
        self.group_loader: GroupLoader | None = None
        self._backend_owner: str | _Missing | None = _MISSING

    def __call__(self, root: nn.Module) -> None:
        """The ``compile_regions`` callback handed to ``wrap_distributed``."""
        self.calls += 1
        if self.calls > 1:
            raise TorchkilnError(
                "compile_regions was called twice; a wrap_distributed plugin "
                "must call it exactly once"
            )
        if state_of(root) is not None:
            raise TorchkilnError(
                "this model is already compiled by torchkiln; call torchkiln.decompile(model) first"
            )
        state = CompileState(
            self.plan,
            self.config,
            [],
            {},
            tagged_before=frozenset(
                name for name, tensor in _tensors(root) if DYNAMO_TENSOR_TAG in tensor.__dict__
            ),
            pending=self.plan.region_count,
            records_before=MetricsMark.now(),
        )
        compile_events.install()
        object.__setattr__(root, STATE_ATTR, state)
        for index, group in enumerate(self.plan.groups):
            preparations = self._prepare(root, state, group)
            self._compile_group(root, state, index, group, preparations)

    def _prepare(
        self, root: nn.Module, state: CompileState, group: RegionGroup
    ) -> list[GroupPreparation]:
        """Ask every plugin to prepare ``group``; install their forwards, keep their undos."""
        preparations = []
        # Each implementation called on its own (in pluggy's order), so that a fault names the
        # plugin it came from.
        for impl in reversed(self.plugins.hook.prepare_group.get_hookimpls()):
            if impl.hookwrapper or impl.wrapper:
                continue
            try:
                preparation = self.plugins.call_impl(
                    "prepare_group",
                    impl,
                    model=root,
                    plan=self.plan,
                    group=group,
                    config=self.config,
                )
            except TorchkilnError:
                raise
            except Exception as error:
                raise raised_in(self.plugins, "prepare_group", error, impl.plugin_name) from error
            if preparation is None:
                continue
            if not isinstance(preparation, GroupPreparation):
                raise bad_result(
                    "prepare_group",
                    impl.plugin_name,
                    preparation,
                    f"torchkiln.plugin.GroupPreparation or None (group {group.name!r})",
                )
            preparations.append(preparation)
        for preparation in preparations:
            for module, forward in preparation.forwards:
                state.replaced_forwards.append((module, module.__dict__.get("forward", _MISSING)))
                module.__dict__["forward"] = forward
            if preparation.undo is not None:
                state.restore.append(preparation.undo)
        return preparations

    def _compile_group(
        self,
        root: nn.Module,
        state: CompileState,
        index: int,
        group: RegionGroup,
        preparations: list[GroupPreparation],
    ) -> None:
        modules = [region.module for region in group.regions]
        shared = group_function(group, index, _wrap_traced(type(modules[0]).forward, preparations))
        state.code_names[group.name] = shared.__code__.co_name
        state.codes[group.name] = shared.__code__
        hooks = list(self.group_hooks)
        if self.config.dispatch in ("direct", "reduced"):
            # last: only what torch.compile returned qualifies, not what another hook put there
            reduced = self.config.dispatch == "reduced"
            hooks.append(direct_dispatch_hook(state.dispatchers, reduced))
        loaded = self._load(shared, group, preparations, hooks)
        compiled_shared, error = (
            (loaded, None)
            if loaded is not None
            else self._compile(shared, group, preparations, hooks)
        )
        if error is None:
            compiled_shared = _wrap_call(compiled_shared, preparations)
        compiled_shared = _named_forward(compiled_shared)  # once per group, not per region
        for region, module in zip(group.regions, modules, strict=True):
            region_state = RegionState(
                region, index, module, module.__dict__.get("forward", _MISSING), owner=state
            )
            state.regions.append(region_state)
            object.__setattr__(module, REGION_ATTR, region_state)
            if error is not None:
                state.settle(region_state, "eager")
                region_state.fallback_reason = (
                    f"compile_region failed: {type(error).__name__}: {_first_line(error)}"
                )
                continue
            compiled, wrapper_code = compiled_shared, shared.__code__.co_name
            if region_state.previous_forward is not _MISSING:
                # A per-instance forward (an autocast wrapper, say) is compiled on its own.
                own = instance_forward_function(
                    region_state.previous_forward, preparations, group.name
                )
                compiled, own_error = self._compile(own, group, preparations)
                if own_error is None:
                    compiled = _wrap_call(compiled, preparations)
                compiled = _named_forward(compiled)
                wrapper_code = own.__code__.co_name
            module.__dict__["forward"] = types.MethodType(
                self._first_call_shim(compiled, index, wrapper_code), module
            )

    def _backend_plugin(self) -> str | None:
        """The plugin that declared the configured backend (``None``: torch's own)."""
        if self._backend_owner is _MISSING:
            declared = self.plugins.backend(self.config.backend)
            self._backend_owner = (
                declared.plugin if declared is not None and declared.plugin != "torch" else None
            )
        return self._backend_owner

    def _load(
        self,
        fn: RegionFunction,
        group: RegionGroup,
        preparations: list[GroupPreparation],
        hooks: list[GroupHook],
    ) -> RegionFunction | None:
        """The group loader's function for ``group``, or ``None`` (compile it)."""
        if self.group_loader is None:
            return None

        def compile_group() -> RegionFunction:
            # No wrap_call here: it is around the loaded function, which calls this one.
            compiled, error = self._compile(fn, group, preparations, hooks)
            if error is not None:  # the eager policy: the calls that needed it run eagerly
                warnings.warn(
                    f"torchkiln: group {group.name!r} runs eagerly for the calls its loaded "
                    f"function does not fit: {_describe_failure(error)}",
                    RuntimeWarning,
                    stacklevel=2,
                )
            return compiled

        return self.group_loader(group, fn, compile_group)

    def _compile(
        self,
        fn: RegionFunction,
        group: RegionGroup,
        preparations: list[GroupPreparation],
        hooks: list[GroupHook] | None = None,
    ) -> tuple[RegionFunction, BaseException | None]:
        """The group's compiled function (inside its trace settings, before any ``wrap_call``:
        the caller adds those), or (under the ``eager`` policy) ``fn`` and the error.

        A plugin raising, answering nothing for its own backend, or returning something that
        is not callable all fail here, at compile time, by the region error policy."""
        in_hook = False
        try:
            compiled = self.plugins.compile_region(
                fn=fn, group=group, config=self.config, backend=self.config.backend
            )
            if not callable(compiled):
                raise bad_result("compile_region", self._backend_plugin(), compiled, "a callable")
            compiled = with_trace_settings(compiled, preparations)
            in_hook = True
            for hook in hooks or ():
                compiled = hook(group, fn, compiled)
            in_hook = False
            return compiled, None
        except Exception as error:
            if in_hook:
                raise  # a group hook's own error (strict artifacts), not a compile failure
            plugin = culprit(self.plugins, "compile_region", error) or self._backend_plugin()
            if self.config.on_region_error == "raise":
                raise RegionCompileError(
                    group.regions[0].path, group.name, error, plugin
                ) from error
            return fn, error

    def _first_call_shim(
        self, compiled_function: Callable[..., Any], group_index: int, wrapper_code: str
    ) -> Callable[..., Any]:
        """``first_call(module, *args, **kwargs)``, installed bound to the region's module.

        Everything per region comes from the module it is bound to (its ``REGION_ATTR``), never
        from this closure: ``copy.deepcopy(model)`` rebinds bound methods, so a copy made before
        the first call runs the copy's own weights and fills the copy's report.

        The shim stays installed until a first call *finishes*: interrupted (``Ctrl-C``), failed
        on the user's own error, or failed to compile under the ``raise`` policy, the next call
        is a first call again, so the region's status always says what happened last.
        """
        group_count = len(self.plan.groups)
        progress = self.progress
        policy = self.config.on_region_error
        shared_by = len(self.plan.groups[group_index].regions)
        from torch._dynamo.comptime import comptime

        check = first_call_check(self.plan.groups[group_index].name)
        plugin = self._backend_plugin()

        def first_call(module: nn.Module, /, *args: Any, **kwargs: Any) -> Any:
            comptime(check)  # only another compile ever traces this shim: a double compile
            region_state: RegionState = module.__dict__[REGION_ATTR]
            state = region_state.owner
            shim = module.__dict__["forward"]
            compiled = types.MethodType(compiled_function, module)
            region = region_state.region
            compile_events.install()  # again, in case torch._dynamo.reset() dropped it
            progress.start(region, region_state.group_index, group_count)
            window = Window.open()
            started = time.perf_counter()
            module.__dict__["forward"] = compiled  # recursion and re-entry see the final state
            try:
                failed = (
                    state.failed_groups.get(region.group)
                    if policy == "eager" and state is not None
                    else None
                )
                if failed is not None and failed is not region_state:
                    output = _run_eagerly_after_sibling(module, region_state, failed, args, kwargs)
                else:
                    with first_call_dynamo_settings(shared_by):
                        output = compiled(*args, **kwargs)
                    _settle(region_state, "compiled")
            except Exception as error:
                output = _handle_failure(
                    module, region_state, shim, error, policy, plugin, args, kwargs
                )
            except BaseException:
                module.__dict__["forward"] = shim  # interrupted: the next call starts over
                raise
            finally:
                _close_window(region_state, window, wrapper_code, started)
                if region_state.status != "pending":
                    progress.done(
                        region, region_state.first_call_seconds or 0.0,
                        region_state.status == "compiled",
                    )  # fmt: skip
                if state is not None and state.pending == 0 and not state.first_calls_done:
                    state.first_calls_done = True
                    for callback in state.on_first_calls_done:
                        callback(state)
            return output

        return _named_forward(first_call)


def _wrap_traced(forward: RegionFunction, preparations: list[GroupPreparation]) -> RegionFunction:
    """``forward`` inside every ``wrap_traced`` wrapper, the first preparation's outermost."""
    for preparation in reversed(preparations):
        if preparation.wrap_traced is not None:
            forward = preparation.wrap_traced(forward)
    return forward


def _wrap_call(compiled: RegionFunction, preparations: list[GroupPreparation]) -> RegionFunction:
    """``compiled`` inside every ``wrap_call`` wrapper, the first preparation's outermost."""
    for preparation in reversed(preparations):
        if preparation.wrap_call is not None:
            compiled = preparation.wrap_call(compiled)
    return compiled


def _settle(region_state: RegionState, status: str) -> None:
    if region_state.owner is not None:
        region_state.owner.settle(region_state, status)
    else:
        region_state.status = status
    if status == "compiled":
        region_state.fallback_reason = None


def _close_window(
    region_state: RegionState, window: Window, wrapper_code: str, started: float
) -> None:
    region_state.first_call_seconds = time.perf_counter() - started
    records, graphs, breaks = window.close(wrapper_code)
    region_state.records.extend(records)
    region_state.graphs += graphs
    for reason, count in breaks.items():
        region_state.graph_breaks[reason] = region_state.graph_breaks.get(reason, 0) + count


def _handle_failure(
    module: nn.Module,
    region_state: RegionState,
    shim: Any,
    error: Exception,
    policy: str,
    plugin: str | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    region = region_state.region
    if isinstance(error, TorchkilnError) and not isinstance(error, RegionCompileError):
        module.__dict__["forward"] = shim  # torchkiln's own verdict (strict artifacts): as is
        raise error
    # Whose error is it? The same call run eagerly tells: a wrong-shaped input fails there too
    # (Dynamo reports it as a failure to trace), a backend that cannot compile or whose code
    # fails at run time does not. Hooks already ran in nn.Module.__call__; only the forward
    # itself runs again.
    _restore_forward(module, region_state.previous_forward)
    try:
        output = module.forward(*args, **kwargs)
    except Exception as eager_error:
        module.__dict__["forward"] = shim  # the user's error: the next call starts over
        if eager_error is error or not _is_compile_failure(error):
            raise error from error.__cause__  # the call failed the same way eagerly
        raise eager_error from None  # eager fails too: the input is wrong, not the compile
    region_state.fallback_reason = _describe_failure(error)
    if policy == "raise":
        _settle(region_state, "failed")
        module.__dict__["forward"] = shim  # the next call tries again (and says how it went)
        raise RegionCompileError(region.path, region.group, error, plugin) from error
    _settle(region_state, "eager")
    if region_state.owner is not None:
        region_state.owner.failed_groups.setdefault(region.group, region_state)
    print(
        f"torchkiln: region {region.display_path} ({region.group}) runs eagerly: "
        f"{region_state.fallback_reason}",
        file=sys.stderr,
    )
    return output


def _run_eagerly_after_sibling(
    module: nn.Module,
    region_state: RegionState,
    failed: RegionState,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    _settle(region_state, "eager")
    region_state.fallback_reason = (
        f"not retried: group {failed.region.group!r} failed to compile at "
        f"{failed.region.display_path}: {failed.fallback_reason}"
    )
    _restore_forward(module, region_state.previous_forward)
    return module.forward(*args, **kwargs)


def _first_line(error: BaseException) -> str:
    return next((line for line in str(error).splitlines() if line.strip()), "")


def _describe_failure(error: BaseException) -> str:
    """``BackendCompilerFailed: backend='x' raised: RuntimeError: why``: Dynamo's wrapper says
    which backend; the exception it wraps says why (on a line of its own, so name it here)."""
    text = f"{type(error).__name__}: {_first_line(error)}"
    inner = getattr(error, "inner_exception", None) or error.__cause__
    if inner is not None and inner is not error:
        text += f" {type(inner).__name__}: {_first_line(inner)}"
    return text


def _restore_forward(module: nn.Module, previous: Any) -> None:
    if previous is _MISSING:
        module.__dict__.pop("forward", None)
    else:
        module.__dict__["forward"] = previous


def decompile(root: nn.Module) -> bool:
    """Remove every compiled path torchkiln installed on ``root``; ``False`` if none.

    Regions are restored by identity, wherever they are now: a block the user deleted or
    replaced after compiling is restored too, and one failing undo never stops the others
    (the first error is raised after all of them ran).
    """
    state = state_of(root)
    if state is None:
        return False
    errors: list[BaseException] = []

    def attempt(action: Callable[[], None]) -> None:
        try:
            action()
        except Exception as error:
            errors.append(error)

    for region_state in state.regions:
        attempt(functools.partial(_decompile_region, root, region_state))
    for module, previous in reversed(state.replaced_forwards):
        attempt(functools.partial(_restore_forward, module, previous))
    for undo in reversed(state.restore):
        attempt(undo)
    attempt(functools.partial(_untag, root, state))
    compile_events.forget(set(state.code_names.values()))
    del root.__dict__[STATE_ATTR]
    if errors:
        raise errors[0]
    return True


def _decompile_region(root: nn.Module, region_state: RegionState) -> None:
    module = region_state.module
    if module is None:  # a state made before modules were recorded
        module = root.get_submodule(region_state.region.path)
    if module.__dict__.get(REGION_ATTR) is region_state:
        _restore_forward(module, region_state.previous_forward)
        del module.__dict__[REGION_ATTR]


def _untag(root: nn.Module, state: CompileState) -> None:
    """Drop the Dynamo tags this compile's calls added (not the ones the user had set)."""
    tensors = dict(_tensors(root))
    in_root = {id(t) for t in tensors.values()}
    for region_state in state.regions:  # regions the user detached from the model since
        module = region_state.module
        if module is None:
            continue
        prefix = f"{region_state.region.path}." if region_state.region.path else ""
        for name, tensor in _tensors(module):
            if id(tensor) not in in_root:
                tensors[prefix + name] = tensor
    for name, tensor in tensors.items():
        if name not in state.tagged_before:
            tensor.__dict__.pop(DYNAMO_TENSOR_TAG, None)


def _tensors(root: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [
        *root.named_parameters(remove_duplicate=False),
        *root.named_buffers(remove_duplicate=False),
    ]
