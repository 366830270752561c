"""What happens when a compiled block is called: docs/architecture.md, "A block's call".

1. The block's ``forward`` is its first-call step (:func:`first_call_step`), bound to it.
2. Its first call times itself, opens a window on Dynamo's records and reports progress.
3. It calls the group's code: the backend's compiled function, or a :class:`GroupCode`.
4. A ``GroupCode``'s first call asks its sources in order (:class:`CodeSource`: the store or
   a peer rank, a precompiled directory); the first that has code serves the group.
5. Each call runs the first loaded function whose saved guards pass; a call none fits (or a
   group no source had code for) runs the backend's code, built on the first such call.
6. A compile failure is handled by ``on_region_error``: raised, or the block runs eagerly.
7. The call finished, the block's status is ``compiled`` or ``eager``, its ``forward`` is the
   group's code itself, and later calls go straight there (or eagerly).
"""

from __future__ import annotations

import contextlib
import functools
import time
import types
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import attrs
from torch import nn

from torchkiln._internals import dynamo, frame_strategy
from torchkiln._internals.aot_artifacts import loaded_guard_table
from torchkiln.engine import dynamo_records
from torchkiln.engine.compile_state import REGION_ATTR, RegionState, _nothing, restore_forward
from torchkiln.engine.double_compile import first_call_check
from torchkiln.engine.dynamo_records import Window
from torchkiln.engine.progress import ProgressObserver
from torchkiln.errors import RegionCompileError, TorchkilnError
from torchkiln.plugin_host.group_preparation import GroupPreparation, RegionFunction
from torchkiln.plugin_host.region_plan import RegionGroup


class RegionFallbackWarning(RuntimeWarning):
    """A region that failed to compile runs eagerly (``on_region_error: eager``)."""


# --- the settings a group's code runs in (``GroupPreparation.trace_settings``) ------------------


SettingsFactory = Callable[[], AbstractContextManager[Any]]


class TraceSettings:
    """``compiled(*args, **kwargs)`` inside every factory's context, first factory outermost
    (so that every call that may trace runs in the preparations' settings).

    Attributes not defined here (``_torchdynamo_orig_callable``, ``aot_compile``, ...) are
    ``compiled``'s, so hooks that look at what ``torch.compile`` returned still see it.
    """

    def __init__(self, compiled: Callable[..., Any], factories: list[SettingsFactory]):
        self.compiled = compiled
        self.factories = factories

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.entered():
            return self.compiled(*args, **kwargs)

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """The settings, for tracing done by other means (``aot_compile`` when precompiling)."""
        with contextlib.ExitStack() as stack:
            for factory in self.factories:
                stack.enter_context(factory())
            yield

    def __deepcopy__(self, memo: dict[int, Any]) -> TraceSettings:
        return self  # shared by copies, as the compiled function is (functions copy as is)

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (_nothing, ())  # a pickled model holds the plain model (CompileState)

    def __getattr__(self, name: str) -> Any:
        if name in ("compiled", "factories"):  # missing only while unpickling: no recursion
            raise AttributeError(name)
        return getattr(self.compiled, name)


def trace_settings_of(compiled: Any) -> AbstractContextManager[Any]:
    """The trace settings ``compiled`` runs in (none: a context that does nothing)."""
    return compiled.entered() if isinstance(compiled, TraceSettings) else contextlib.nullcontext()


def with_trace_settings(
    compiled: Callable[..., Any], preparations: list[GroupPreparation]
) -> Callable[..., Any]:
    """``compiled`` wrapped in the preparations' trace settings; itself when there are none."""
    factories = [p.trace_settings for p in preparations if p.trace_settings is not None]
    return TraceSettings(compiled, factories) if factories else compiled


# --- the group's code: sources before the backend --------------------------------------------


@attrs.define
class Loaded:
    """Saved compiled functions a source loaded for a group, tried in order by their guards."""

    source: str
    """Where they came from, for the report (``store``, ``rank 0``, ``artifacts DIR``)."""
    functions: list[tuple[str, RegionFunction]]
    """``(kind, function)`` as ``torch.compiler.load_compiled_function`` returned them."""
    closure: dict[str, Any]
    """The group function's closure, by name: torch's guards read it as frame locals."""
    on_miss: Callable[[str | None], None] = lambda reason: None
    """Called on each call no function fits (``reason`` on the first only); may raise."""


@attrs.define
class GroupCall:
    """A group's first call, as its sources see it."""

    group: RegionGroup
    shared: RegionFunction
    """The group's function (the code every loaded function was compiled from)."""
    module: nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    build_savable: Callable[[], Any]
    """The group function under the backend with ``fullgraph`` set (what torch can save)."""
    code: GroupCode


class CodeSource:
    """A place a group's compiled code may come from, before the backend compiles it."""

    name = "source"

    def attach(self, group: RegionGroup, shared: RegionFunction) -> bool:
        """At compile time: whether to ask this source at the group's first call."""
        return True

    def load(self, call: GroupCall) -> Loaded | None:
        """At the group's first call: its loaded code, or ``None`` (the next source is asked)."""
        raise NotImplementedError


class GroupCode:
    """A group's function ``fn(module, *args, **kwargs)`` served by its sources' code.

    ``state``: ``pending`` until the first call, then ``serving`` (a source's functions, the
    backend's code for the calls they do not fit) or ``compiled`` (no source had code: the
    backend's code serves every call)."""

    def __init__(
        self,
        group: RegionGroup,
        shared: RegionFunction,
        sources: list[CodeSource],
        build: Callable[[], RegionFunction],
        build_savable: Callable[[], Any],
    ):
        self.group = group
        self.shared = shared
        self.sources = sources
        self._build = build
        self._build_savable = build_savable
        self.state = "pending"
        self.loaded: Loaded | None = None
        self._table: Any = None
        self._built: RegionFunction | None = None
        self.hits = 0
        self.misses = 0
        self.miss_reason: str | None = None

    def __call__(self, module: nn.Module, /, *args: Any, **kwargs: Any) -> Any:
        if self.state == "pending":
            self._first(module, args, kwargs)
        if self._table is not None:
            f_locals = {**self.loaded.closure, "module": module, "args": args, "kwargs": kwargs}  # type: ignore[union-attr]
            fn = self._table.find(f_locals)
            if fn is not None:
                self.hits += 1
                return fn(module, *args, **kwargs)
            self._miss(f_locals)
        if self._built is None:
            self._built = self._build()
        return self._built(module, *args, **kwargs)

    def line(self) -> str:
        """The report's line for this group's code."""
        if self.state != "serving":
            return f"{self.group.name}: {self.state}"
        assert self.loaded is not None
        functions = self.loaded.functions
        kinds = ", ".join(dict.fromkeys(kind for kind, _ in functions))
        built = f"; {self.misses} compiled by the backend" if self.misses else ""
        return (
            f"{self.group.name}: serving from {self.loaded.source} ({len(functions)} "
            f"functions: {kinds}): {self.hits} calls fit{built}"
        )

    def _first(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        call = GroupCall(self.group, self.shared, module, args, kwargs, self._build_savable, self)
        for source in self.sources:
            loaded = source.load(call)
            if loaded is not None:
                self.loaded, self.state = loaded, "serving"
                self._table = loaded_guard_table(fn for _, fn in loaded.functions)
                return
        self.state = "compiled"

    def _miss(self, f_locals: dict[str, Any]) -> None:
        self.misses += 1
        if self.miss_reason is not None:
            self.loaded.on_miss(None)  # type: ignore[union-attr]
            return
        assert self.loaded is not None
        failures = self._table.first_failures(f_locals)
        self.miss_reason = "; ".join(
            f"{kind}: {(failed or 'guards pass')[:300]}"
            for (kind, _), failed in zip(self.loaded.functions, failures, strict=True)
        )
        self.loaded.on_miss(self.miss_reason)


@functools.cache
def traceable_int_patch() -> bool:
    """Whether this torch can set ``allow_unspec_int_on_nn_module`` inside a traced function
    (``torch._dynamo.patch_dynamo_config``): then the setting holds for every trace of a group's
    code, later recompiles included, and never changes process-wide state."""
    try:
        dynamo.traced_config_patcher()(allow_unspec_int_on_nn_module=True)
    except (AttributeError, ValueError):
        return False
    return True


def first_call_dynamo_settings(shared_by: int) -> Any:
    """Dynamo settings for a region's first (compiling) call only, restored on exit: module int
    attributes traced as symbolic, so blocks that differ only in ``layer_idx`` share one graph
    (docs/architecture.md, "Blocks that differ only in an integer"). Nothing when the group
    function sets it while tracing (:func:`traceable_int_patch`)."""
    if shared_by < 2 or traceable_int_patch():
        return contextlib.nullcontext()
    return dynamo.config_patch(allow_unspec_int_on_nn_module=True)


# --- the block's first call --------------------------------------------------------------------


def first_call_step(
    compiled_function: RegionFunction,
    group: RegionGroup,
    group_count: int,
    wrapper_code: str,
    progress: ProgressObserver,
    policy: str,
    plugin: str | None,
) -> RegionFunction:
    """``first_call(module, *args, **kwargs)``, installed bound to each region's module.

    Everything per region comes from the module it is bound to (its ``REGION_ATTR``), never
    from this closure: ``copy.deepcopy(model)`` rebinds bound methods, so a copy made before
    the first call runs the copy's own weights and fills the copy's report. It stays installed
    until a first call *finishes*: interrupted, failed on the user's own error, or failed under
    the ``raise`` policy, the next call is a first call again."""
    comptime = dynamo.comptime_function()
    check = first_call_check(group.name)

    def first_call(module: nn.Module, /, *args: Any, **kwargs: Any) -> Any:
        comptime(check)  # only another compile ever traces this step: a double compile
        region_state: RegionState = module.__dict__[REGION_ATTR]
        state = region_state.owner
        step = module.__dict__["forward"]
        compiled = types.MethodType(compiled_function, module)
        region = region_state.region
        dynamo_records.install()  # again, in case torch._dynamo.reset() dropped it
        progress.start(region, region_state.group_index, group_count)
        window = Window.open()
        eager_before = (region_state.eager_calls, region_state.first_eager)
        started = time.perf_counter()
        module.__dict__["forward"] = compiled  # recursion and re-entry see the final state
        try:
            failed = state.failed_groups.get(region.group) if policy == "eager" else None
            if failed is not None and failed is not region_state:
                state.set_status(region_state, "eager")
                region_state.fallback_reason = (
                    f"not retried: group {failed.region.group!r} failed to compile at "
                    f"{failed.region.display_path}: {failed.fallback_reason}"
                )
                restore_forward(module, region_state.previous_forward)
                output = module.forward(*args, **kwargs)
            else:
                with first_call_dynamo_settings(len(group.regions)):
                    output = compiled(*args, **kwargs)
                state.set_status(region_state, "compiled")
        except Exception as error:
            output = _handle_failure(
                module, region_state, step, error, policy, plugin, args, kwargs
            )
        except BaseException:
            module.__dict__["forward"] = step  # interrupted: the next call starts over
            raise
        finally:
            if module.__dict__.get("forward") is step:
                # Not finished: the next call is a first call again; this one does not count.
                region_state.eager_calls, region_state.first_eager = eager_before
            _close_window(region_state, window, wrapper_code, started)
            if region_state.status != "pending":
                ok = region_state.status == "compiled"
                progress.done(region, region_state.first_call_seconds or 0.0, ok)
            if state.pending == 0 and not state.first_calls_done:
                state.first_calls_done = True
                for callback in state.on_first_calls_done:
                    callback(state)
        return output

    first_call.__name__ = "forward"  # pickles as getattr(module, "forward")
    return first_call


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
    step: Any,
    error: Exception,
    policy: str,
    plugin: str | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    region = region_state.region
    if isinstance(error, TorchkilnError) and not isinstance(error, RegionCompileError):
        module.__dict__["forward"] = step  # torchkiln's own verdict (strict artifacts): as is
        raise error
    # Whose error is it? The same call run eagerly tells: a wrong-shaped input fails there too
    # (Dynamo reports it as a failure to trace), a backend that cannot compile or whose code
    # fails at run time does not. Hooks already ran in nn.Module.__call__; only the forward
    # itself runs again.
    restore_forward(module, region_state.previous_forward)
    try:
        output = module.forward(*args, **kwargs)
    except Exception as eager_error:
        module.__dict__["forward"] = step  # the user's error: the next call starts over
        # Nor may it stop Dynamo compiling the group's code: torch 2.14+ marks it "skip" for
        # good when the error unwound through the group function's ``with`` block.
        frame_strategy.resume_compiling(region_state.group_code())
        if eager_error is error or not isinstance(
            error, dynamo.exception_type() | RegionCompileError
        ):
            raise error from error.__cause__  # the call failed the same way eagerly
        raise eager_error from None  # eager fails too: the input is wrong, not the compile
    region_state.fallback_reason = describe_failure(error)
    if policy == "raise":
        region_state.owner.set_status(region_state, "failed")
        module.__dict__["forward"] = step  # the next call tries again (and says how it went)
        raise RegionCompileError(region.path, region.group, error, plugin) from error
    region_state.owner.set_status(region_state, "eager")
    region_state.owner.failed_groups.setdefault(region.group, region_state)
    warnings.warn(
        f"torchkiln: region {region.display_path} ({region.group}) runs eagerly: "
        f"{region_state.fallback_reason}",
        RegionFallbackWarning,
        stacklevel=2,
    )
    return output


def first_line(error: BaseException) -> str:
    return next((line for line in str(error).splitlines() if line.strip()), "")


def describe_failure(error: BaseException) -> str:
    """``BackendCompilerFailed: backend='x' raised: RuntimeError: why``: Dynamo's wrapper says
    which backend; the exception it wraps says why (on a line of its own, so name it here)."""
    text = f"{type(error).__name__}: {first_line(error)}"
    inner = getattr(error, "inner_exception", None) or error.__cause__
    if inner is not None and inner is not error:
        text += f" {type(inner).__name__}: {first_line(inner)}"
    return text
