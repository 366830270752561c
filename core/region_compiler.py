"""Compile regions in place and undo it.

Each region's ``forward`` becomes an instance attribute: the group's compiled function bound to
the module. ``nn.Module.__call__`` still runs the module's hooks eagerly around it, exactly as
with ``nn.Module.compile()``; the class, attributes, children and ``state_dict()`` keys are
untouched. Unlike ``nn.Module.compile()`` this also compiles ``torch.nn`` built-ins
(``nn.Linear``, ``nn.TransformerEncoderLayer``): Dynamo skips a *top* frame whose code lives in
``torch/nn``, so each group is compiled through a small function of its own (a fresh code
object per group, hence one Dynamo cache per group shared by all of its regions).

The first call of each region goes through a shim that times it, reads Dynamo's records,
applies the region error policy and reports progress; it then installs the bare compiled
function, so nothing of torchkiln stays on the forward path.
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
from collections.abc import Callable
from typing import Any

import attrs
import torch
from torch import nn

from torchkiln.config import CompileConfig
from torchkiln.double_compile import first_call_check, group_function_check
from torchkiln.dynamo_metrics import CompileRecord, Window
from torchkiln.errors import PluginError, RegionCompileError, TorchkilnError
from torchkiln.group_preparation import GroupPreparation, RegionFunction
from torchkiln.progress import ProgressObserver
from torchkiln.region_plan import Region, RegionGroup, RegionPlan

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
    previous_forward: Any = _MISSING
    """The instance-level ``forward`` the module had before, if any (restored by decompile)."""
    status: str = "pending"
    """``pending`` (not called yet), ``compiled``, ``eager`` (fell back), ``failed``."""
    fallback_reason: str | None = None
    first_call_seconds: float | None = None
    records: list[CompileRecord] = attrs.Factory(list)
    graphs: int = 0
    graph_breaks: dict[str, int] = attrs.Factory(dict)
    owner: CompileState | None = attrs.field(default=None, repr=False)
    """The root's state this region belongs to (deep copies keep the pair together)."""


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

    @property
    def pending(self) -> int:
        return sum(state.status == "pending" for state in self.regions)

    def __reduce_ex__(self, protocol: Any) -> Any:
        # Pickling would "succeed" and write a file that fails to load (the compiled forwards
        # are pickled by a name that does not exist): refuse at save time, saying what works.
        raise TorchkilnError(
            "a model compiled by torchkiln cannot be pickled whole (torch.save(model)): save "
            "model.state_dict() (its keys are the plain model's), or call "
            "torchkiln.decompile(model) first"
        )

    def __copy__(self) -> CompileState:
        return attrs.evolve(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> CompileState:
        copied = object.__new__(CompileState)
        memo[id(self)] = copied
        for field in attrs.fields(CompileState):
            object.__setattr__(copied, field.name, copy.deepcopy(getattr(self, field.name), memo))
        return copied


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
        )
        object.__setattr__(root, STATE_ATTR, state)
        for index, group in enumerate(self.plan.groups):
            preparations = self._prepare(root, state, group)
            self._compile_group(root, state, index, group, preparations)

    def _prepare(
        self, root: nn.Module, state: CompileState, group: RegionGroup
    ) -> list[GroupPreparation]:
        """Ask every plugin to prepare ``group``; install their forwards, keep their undos."""
        preparations = [
            preparation
            for preparation in self.plugins.hook.prepare_group(
                model=root, plan=self.plan, group=group, config=self.config
            )
            if preparation is not None
        ]
        for preparation in preparations:
            if not isinstance(preparation, GroupPreparation):
                raise PluginError(
                    f"prepare_group returned {type(preparation).__name__} for group "
                    f"{group.name!r}; expected torchkiln.plugin.GroupPreparation or None"
                )
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
        modules = [root.get_submodule(region.path) for region in group.regions]
        shared = group_function(group, index, _wrap_traced(type(modules[0]).forward, preparations))
        state.code_names[group.name] = shared.__code__.co_name
        compiled_shared, error = self._compile(shared, group, preparations, self.group_hooks)
        for region, module in zip(group.regions, modules, strict=True):
            region_state = RegionState(
                region, index, module.__dict__.get("forward", _MISSING), owner=state
            )
            state.regions.append(region_state)
            object.__setattr__(module, REGION_ATTR, region_state)
            if error is not None:
                region_state.status = "eager"
                region_state.fallback_reason = (
                    f"compile_region failed: {type(error).__name__}: {error}"
                )
                continue
            compiled, wrapper_code = compiled_shared, shared.__code__.co_name
            if region_state.previous_forward is not _MISSING:
                # A per-instance forward (an autocast wrapper, say) is compiled on its own.
                own = instance_forward_function(
                    region_state.previous_forward, preparations, group.name
                )
                compiled, _ = self._compile(own, group, preparations)
                wrapper_code = own.__code__.co_name
            module.__dict__["forward"] = types.MethodType(
                self._first_call_shim(compiled, index, wrapper_code), module
            )

    def _compile(
        self,
        fn: RegionFunction,
        group: RegionGroup,
        preparations: list[GroupPreparation],
        hooks: list[GroupHook] | None = None,
    ) -> tuple[RegionFunction, BaseException | None]:
        in_hook = False
        try:
            compiled = self.plugins.compile_region(
                fn=fn, group=group, config=self.config, backend=self.config.backend
            )
            in_hook = True
            for hook in hooks or ():
                compiled = hook(group, fn, compiled)
            in_hook = False
            return _wrap_call(compiled, preparations), None
        except Exception as error:
            if in_hook:
                raise  # a group hook's own error (strict artifacts), not a compile failure
            if self.config.on_region_error == "raise":
                declared = self.plugins.backends().get(self.config.backend)
                plugin = (
                    declared.plugin if declared is not None and declared.plugin != "torch" else None
                )
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
        """
        group_count = len(self.plan.groups)
        progress = self.progress
        policy = self.config.on_region_error
        shared_by = len(self.plan.groups[group_index].regions)
        from torch._dynamo.comptime import comptime

        check = first_call_check(self.plan.groups[group_index].name)

        def first_call(module: nn.Module, /, *args: Any, **kwargs: Any) -> Any:
            comptime(check)  # only another compile ever traces this shim: a double compile
            region_state: RegionState = module.__dict__[REGION_ATTR]
            state = region_state.owner
            compiled = types.MethodType(compiled_function, module)
            region = region_state.region
            progress.start(region, region_state.group_index, group_count)
            window = Window.open()
            started = time.perf_counter()
            module.__dict__["forward"] = compiled  # recursion and re-entry see the final state
            try:
                failed = _failed_sibling(state, region_state) if policy == "eager" else None
                if failed is not None:
                    output = _run_eagerly_after_sibling(module, region_state, failed, args, kwargs)
                else:
                    with first_call_dynamo_settings(shared_by):
                        output = compiled(*args, **kwargs)
                    region_state.status = "compiled"
            except Exception as error:
                output = _handle_failure(module, region_state, error, policy, args, kwargs)
            finally:
                region_state.first_call_seconds = time.perf_counter() - started
                region_state.records, region_state.graphs, region_state.graph_breaks = window.close(
                    wrapper_code
                )
                progress.done(
                    region, region_state.first_call_seconds, region_state.status == "compiled"
                )
                if state is not None and state.pending == 0:
                    for callback in state.on_first_calls_done:
                        callback(state)
            return output

        return first_call


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


def _handle_failure(
    module: nn.Module,
    region_state: RegionState,
    error: Exception,
    policy: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    region = region_state.region
    if not _is_compile_failure(error):
        region_state.status = "compiled"
        raise error  # the user's own error, raised the same way eager would
    region_state.fallback_reason = _describe_failure(error)
    if policy == "raise":
        region_state.status = "failed"
        raise RegionCompileError(region.path, region.group, error) from error
    region_state.status = "eager"
    _restore_forward(module, region_state.previous_forward)
    print(
        f"torchkiln: region {region.display_path} ({region.group}) runs eagerly: "
        f"{region_state.fallback_reason}",
        file=sys.stderr,
    )
    # Hooks already ran in nn.Module.__call__; only the forward itself runs again, eagerly.
    return module.forward(*args, **kwargs)


def _failed_sibling(state: CompileState | None, region_state: RegionState) -> RegionState | None:
    """A region of the same group whose compile already failed (so this one is not retried)."""
    if state is None:
        return None
    return next(
        (
            other
            for other in state.regions
            if other is not region_state
            and other.region.group == region_state.region.group
            and other.status == "eager"
            and other.fallback_reason
        ),
        None,
    )


def _run_eagerly_after_sibling(
    module: nn.Module,
    region_state: RegionState,
    failed: RegionState,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    region_state.status = "eager"
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
    """Remove every compiled path torchkiln installed on ``root``; ``False`` if none."""
    state = state_of(root)
    if state is None:
        return False
    for region_state in state.regions:
        module = root.get_submodule(region_state.region.path)
        _restore_forward(module, region_state.previous_forward)
        module.__dict__.pop(REGION_ATTR, None)
    for module, previous in reversed(state.replaced_forwards):
        _restore_forward(module, previous)
    for undo in reversed(state.restore):
        undo()
    for name, tensor in _tensors(root):
        if name not in state.tagged_before:
            tensor.__dict__.pop(DYNAMO_TENSOR_TAG, None)
    del root.__dict__[STATE_ATTR]
    return True


def _tensors(root: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [
        *root.named_parameters(remove_duplicate=False),
        *root.named_buffers(remove_duplicate=False),
    ]
