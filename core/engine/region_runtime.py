"""A compiled region's runtime: docs/architecture.md, "A block's call".

``torchkiln.compile`` installs one :class:`RegionRuntime` as each region's instance ``forward``
and ``torchkiln.decompile`` removes it; nothing swaps the ``forward`` in between, whatever the
calls do (a first call, a later one, a miss, a fallback to eager). Every call goes through it:

1. A finished region calls :attr:`RegionRuntime.run` (the group's code, or the region's own
   forward run eagerly), one small frame in front of it.
2. Otherwise the call is a first call (:class:`FirstCall`): it times itself, opens a window on
   Dynamo's records, reports progress, and calls the group's code.
3. A compile failure is handled by ``on_region_error``: raised (the next call is a first call
   again), or the region runs eagerly from then on (:func:`eager_forward`).
4. The call finished, the region's status (:class:`~torchkiln.engine.states.State`) is
   ``serving`` (its group's code came from a source), ``compiled`` or ``eager``, and :attr:`run`
   says what serves its later calls. An interrupted call, or one that failed on the user's own
   error, leaves the region pending: the next call is a first call again.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import time
import warnings
from collections.abc import Callable
from typing import Any

from torch import nn

from torchkiln._internals import dynamo, frame_strategy
from torchkiln.engine.compile_state import MISSING, REGION_ATTR, RegionState
from torchkiln.engine.double_compile import first_call_check
from torchkiln.engine.dynamo_records import Window
from torchkiln.engine.progress import NullProgress, ProgressObserver
from torchkiln.engine.states import State
from torchkiln.errors import RegionCompileError, TorchkilnError
from torchkiln.plugin_host.group_preparation import RegionFunction
from torchkiln.plugin_host.region_plan import RegionGroup


class RegionFallbackWarning(RuntimeWarning):
    """A region that failed to compile runs eagerly (``on_region_error: eager``)."""


def eager_forward(module: nn.Module, /, *args: Any, **kwargs: Any) -> Any:
    """The region's own forward, as before compiling: its earlier instance ``forward`` (an
    autocast wrapper, say), else its class's."""
    previous = module.__dict__[REGION_ATTR].previous_forward
    if previous is MISSING:
        return type(module).forward(module, *args, **kwargs)
    return previous(*args, **kwargs)


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


class RegionRuntime:
    """One compiled region's ``forward``: the same object from ``compile`` to ``decompile``.

    Everything per region comes from :attr:`region_state` (a deep copy of the model copies it
    with the module, so a copy runs its own weights and fills its own report); the code is
    shared with the region's group."""

    def __init__(
        self,
        region_state: RegionState,
        code: RegionFunction,
        first_call: FirstCall,
        check: Callable[[Any], None] | None = None,
    ):
        self.region_state = region_state
        self.code = code
        """The group's code, ``fn(module, *args, **kwargs)``."""
        self.first_call = first_call
        self.run: RegionFunction | None = None
        """What serves the region's calls once a first call finished (``code`` or
        :func:`eager_forward`); ``None`` while the next call is a first call."""
        self.check = check
        """The group function's double-compile check, where plugins' ``wrap_call`` wrappers
        run in front of it (``region_compiler._wrap_call``); ``None``: none needed."""
        self.comptime = first_call.comptime

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        run = self.run
        if run is not None:
            if self.check is not None and run is self.code:
                # Does nothing unless another compile traces this call: then it is traced
                # before any wrapper that might break that compile's graph (a region run
                # eagerly after a failed compile has no group code to check, as before).
                self.comptime(self.check)
            return run(self.region_state.module, *args, **kwargs)
        return self.first_call(self, args, kwargs)

    def __deepcopy__(self, memo: dict[int, Any]) -> RegionRuntime:
        copied = object.__new__(RegionRuntime)  # not copy.copy: that would use __reduce_ex__
        copied.__dict__.update(self.__dict__)  # the code is shared, as compiled functions are
        memo[id(self)] = copied
        copied.region_state = copy.deepcopy(self.region_state, memo)
        return copied

    def __reduce_ex__(self, protocol: Any) -> Any:
        # A pickled model is the plain model: this loads as the module's own forward, and
        # loading ends by taking it off (compile_state._plain_after_load).
        return (getattr, (self.region_state.module, "forward"))


class FirstCall:
    """A region's first call, with what its group shares (one per group and instance code)."""

    def __init__(
        self,
        group: RegionGroup,
        group_count: int,
        wrapper_code: str,
        progress: ProgressObserver,
        policy: str,
        plugin: str | None,
        group_code: Any = None,
    ):
        self.group = group
        self.group_code = group_code
        """The group's :class:`~torchkiln.engine.group_runtime.GroupCode` where sources may
        serve it (its state after the call is the region's), else ``None``."""
        self.group_count = group_count
        self.wrapper_code = wrapper_code
        self.progress = None if isinstance(progress, NullProgress) else progress
        """``None``: no progress display (nothing to call on the first-call path)."""
        self.patch_ints = len(group.regions) > 1 and not traceable_int_patch()
        """Whether the first call sets Dynamo's ``allow_unspec_int_on_nn_module`` itself
        (:func:`first_call_dynamo_settings`), decided here once."""
        self.policy = policy
        self.plugin = plugin
        self.comptime = dynamo.comptime_function()
        self.check = first_call_check(group.name)

    def __call__(
        self, runtime: RegionRuntime, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        self.comptime(self.check)  # only another compile ever traces this step: a double compile
        region_state = runtime.region_state
        module, state, region = region_state.module, region_state.owner, region_state.region
        if self.progress is not None:
            self.progress.start(region, region_state.group_index, self.group_count)
        # Opening it installs the compile observer again (torch._dynamo.reset() drops it).
        window = Window.open()
        eager_before = (region_state.eager_calls, region_state.first_eager)
        started = time.perf_counter()
        runtime.run = runtime.code  # recursion and re-entry see the final state
        try:
            failed = state.failed_groups.get(region.group) if self.policy == "eager" else None
            if failed is not None and failed is not region_state:
                state.set_status(region_state, State.EAGER)
                region_state.fallback_reason = (
                    f"not retried: group {failed.region.group!r} failed to compile at "
                    f"{failed.region.display_path}: {failed.fallback_reason}"
                )
                runtime.run = eager_forward
                output = eager_forward(module, *args, **kwargs)
            else:
                if self.patch_ints:
                    with first_call_dynamo_settings(len(self.group.regions)):
                        output = runtime.code(module, *args, **kwargs)
                else:
                    output = runtime.code(module, *args, **kwargs)
                # Its group's state is the region's: serving where a source's code serves it.
                code = self.group_code
                served = code is not None and code.state is State.SERVING
                state.set_status(region_state, State.SERVING if served else State.COMPILED)
        except Exception as error:
            output = self._failed(runtime, error, args, kwargs)
        except BaseException:
            runtime.run = None  # interrupted: the next call starts over
            raise
        finally:
            if runtime.run is None:
                # Not finished: the next call is a first call again; this one does not count.
                region_state.eager_calls, region_state.first_eager = eager_before
            region_state.first_call_seconds = time.perf_counter() - started
            window.close_into(region_state, self.wrapper_code)
            if self.progress is not None and region_state.status is not State.PENDING:
                ok = region_state.status in (State.COMPILED, State.SERVING)
                self.progress.done(region, region_state.first_call_seconds or 0.0, ok)
            if state.pending == 0 and not state.first_calls_done:
                state.first_calls_done = True
                for callback in state.on_first_calls_done:
                    callback(state)
        return output

    def _failed(
        self,
        runtime: RegionRuntime,
        error: Exception,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        region_state = runtime.region_state
        module, region = region_state.module, region_state.region
        if isinstance(error, TorchkilnError) and not isinstance(error, RegionCompileError):
            runtime.run = None  # torchkiln's own verdict (strict artifacts): as is
            raise error
        # Whose error is it? The same call run eagerly tells: a wrong-shaped input fails there
        # too (Dynamo reports it as a failure to trace), a backend that cannot compile or whose
        # code fails at run time does not. Hooks already ran in nn.Module.__call__; only the
        # forward itself runs again.
        runtime.run = eager_forward
        try:
            output = eager_forward(module, *args, **kwargs)
        except Exception as eager_error:
            runtime.run = None  # the user's error: the next call starts over
            # Nor may it stop Dynamo compiling the group's code: torch 2.14+ marks it "skip"
            # for good when the error unwound through the group function's ``with`` block.
            frame_strategy.resume_compiling(region_state.group_code())
            if eager_error is error or not isinstance(
                error, dynamo.exception_type() | RegionCompileError
            ):
                raise error from error.__cause__  # the call failed the same way eagerly
            raise eager_error from None  # eager fails too: the input is wrong, not the compile
        region_state.fallback_reason = describe_failure(error)
        if self.policy == "raise":
            region_state.owner.set_status(region_state, State.FAILED)
            runtime.run = None  # the next call tries again (and says how it went)
            raise RegionCompileError(region.path, region.group, error, self.plugin) from error
        region_state.owner.set_status(region_state, State.EAGER)
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
