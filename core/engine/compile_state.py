"""What a compile leaves on the model, and taking it away again.

:class:`CompileState` lives in the root module's ``__dict__`` (:data:`STATE_ATTR`), a
:class:`RegionState` in each compiled region's (:data:`REGION_ATTR`); both pickle as nothing,
so ``torch.save(model)`` saves the plain model. :func:`decompile` restores every region by
identity and runs the undo actions plugins added (:func:`add_undo`).
"""

from __future__ import annotations

import copy
import enum
import functools
import itertools
import types
import weakref
from collections.abc import Callable
from typing import Any

import attrs
import torch
from torch import nn

from torchkiln._internals import dynamo
from torchkiln.configuration.config import CompileConfig
from torchkiln.engine import dynamo_records
from torchkiln.engine.dynamo_records import CompileRecord, HeldRecords
from torchkiln.engine.states import State
from torchkiln.plugin_host.region_plan import Region, RegionPlan

STATE_ATTR = "_torchkiln_compiled"
REGION_ATTR = "_torchkiln_region"
"""Set in each compiled region's ``__dict__`` (its :class:`RegionState`), removed by decompile."""


class Missing(enum.Enum):
    # An enum member, not object(): copy.deepcopy(model) must keep the sentinel identical, or
    # decompiling the copy installs the copied sentinel as its forward.
    MISSING = "MISSING"


MISSING = Missing.MISSING
"""``RegionState.previous_forward`` when the module had no instance-level ``forward``."""


@attrs.define(eq=False)
class RegionState:
    """What torchkiln knows about one compiled region."""

    region: Region
    group_index: int
    module: nn.Module = attrs.field(repr=False)
    """The compiled module itself: decompile restores it by identity, wherever it is now."""
    previous_forward: Any = MISSING
    """The instance-level ``forward`` the module had before, if any (restored by decompile)."""
    status: State = State.PENDING
    """:class:`~torchkiln.engine.states.State`: ``pending`` (no first call finished yet),
    ``serving`` (its group's code came from a source), ``compiled``, ``eager`` (fell back),
    ``failed`` (its compile raised under ``on_region_error='raise'``; the next call retries)."""
    fallback_reason: str | None = None
    first_call_seconds: float | None = None
    records: list[CompileRecord] = attrs.Factory(list)
    graphs: int = 0
    graph_breaks: dict[str, int] = attrs.Factory(dict)
    owner: CompileState = attrs.field(repr=False, kw_only=True)
    """The root's state this region belongs to (deep copies keep the pair together)."""
    eager_calls: int = 0
    """Calls that ran this region's code eagerly (Dynamo ran the group's function without
    compiled code: a recompile-limit hit, ``force_eager``, a skipped frame). Counted by the
    group's function itself (:func:`ran_eagerly`), in code that compiled code never contains."""
    first_eager: EagerRun | None = None
    """What the first of those calls saw, taken at that call."""

    def group_code(self) -> types.CodeType:
        """Its group's compiled function's code object (Dynamo's cache entries hang off it)."""
        return self.owner.codes[self.region.group]

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (_nothing, ())  # a pickled model is the plain model (see CompileState)

    def __copy__(self) -> RegionState:
        return attrs.evolve(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> RegionState:
        return _deepcopy_fields(self, memo)


@attrs.frozen
class EagerRun:
    """The first call that ran a region eagerly, as seen during that call (so under that
    call's grad mode, dtype and stance, never the report's)."""

    order: int
    """A process-wide sequence number: the earliest eager run of a group is where it began."""
    cached: int
    """Dynamo's cached graphs for the group's code at that call."""
    failed_guards: tuple[str, ...]
    """For each cached graph, the first guard that call failed."""
    stance: str
    """``torch.compiler``'s stance at that call (``default`` unless the user set one)."""


_EAGER_ORDER = itertools.count()


@torch.compiler.disable(recursive=True)
def ran_eagerly(frame_locals: dict[str, Any]) -> None:
    """Count one eager run of the region ``frame_locals["module"]``; the first also records
    which guard each cached graph failed, with this call's locals and global state.

    Called by a group's function only when ``torch.compiler.is_compiling()`` is false (folded
    away while tracing: compiled code never calls it). Never traced itself: where Dynamo runs a
    group's frame eagerly, it would otherwise compile this bookkeeping (seen on torch 2.15)."""
    region_state = region_state_of(frame_locals.get("module"))
    if region_state is None:
        return
    if region_state.first_eager is None:
        code = region_state.group_code()
        failed, cached = dynamo_records.failed_guards_and_count(code, frame_locals)
        stance = dynamo.stance_name()
        region_state.first_eager = EagerRun(next(_EAGER_ORDER), cached, tuple(failed), stance)
    region_state.eager_calls += 1


@attrs.define(eq=False)
class CompileState:
    """State kept on the root module (in ``__dict__``, never as a submodule or buffer)."""

    plan: RegionPlan
    config: CompileConfig
    regions: list[RegionState] = attrs.Factory(list)
    code_names: dict[str, str] = attrs.Factory(dict)
    """Group name -> the co_name of its compiled function (to attribute later recompiles)."""
    replaced_forwards: list[tuple[nn.Module, Any]] = attrs.Factory(list)
    """``(module, previous forward)`` for each forward a group preparation installed on a
    submodule (the hierarchical selector's nested blocks)."""
    notes: list[str] = attrs.Factory(list)
    """What group preparations run outside the compiled code (``GroupPreparation.notes``)."""
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
    report_causes: tuple[Any, ...] = ()
    """Named causes the plugins declared (``ReportCause``), tried before the built-in ones."""
    providers: dict[str, str] = attrs.Factory(dict)
    """``backend`` / ``selector`` -> the plugin that served it (the report names them)."""
    records_before: HeldRecords | None = None
    """Dynamo's records from before this compile (never this model's)."""
    later_records: dict[str, tuple[str, CompileRecord]] = attrs.Factory(dict)
    """Compile id -> (group, record) of compiles after the first calls, as reports saw them
    (Dynamo keeps only its most recent records)."""
    tiered: Any = None
    """The tiered runtime (:class:`torchkiln.tiered.runtime.TieredForward`), when installed."""
    remote_cache: Any = None
    """``remote_cache``: the :class:`torchkiln.artifacts.remote_cache.RemoteCacheWatch`."""
    job: Any = None
    """Compiling once per job: the :class:`torchkiln.jobs.share.JobShare` serving the groups,
    or a :class:`torchkiln.jobs.share.JobReport` saying why the ranks do not share."""
    group_codes: dict[str, Any] = attrs.Factory(dict)
    """Group -> its :class:`~torchkiln.engine.group_runtime.GroupCode`, for a group served by
    a source's code (the report names each one's state)."""
    frozen: Any = None
    """Serving mode: the :class:`~torchkiln.engine.serving.Freeze` after ``torchkiln.freeze``."""
    root: weakref.ref[nn.Module] | None = attrs.field(default=None, repr=False)
    """The module this state lives on: decompiling through another object that holds all of
    its regions (PEFT's merged model) also clears it there."""

    def set_status(self, region_state: RegionState, status: State) -> None:
        """Set a region's status, keeping :attr:`pending` right (a region that runs compiled
        code has no fallback reason)."""
        self.pending += (status is State.PENDING) - (region_state.status is State.PENDING)
        region_state.status = status
        if status in (State.COMPILED, State.SERVING):
            region_state.fallback_reason = None

    def __reduce_ex__(self, protocol: Any) -> Any:
        # torch.save(model) opens (and truncates) its file before pickling starts, so refusing
        # here would destroy an existing checkpoint. Instead the pickle holds the plain model:
        # each compiled forward pickles as ``getattr(module, "forward")`` (its function is
        # named ``forward``), and loading ends by putting every region's own forward back.
        pairs = [(state.module, state.previous_forward) for state in self.regions]
        pairs += self.replaced_forwards
        if self.tiered is not None:
            pairs += self.tiered.installed_pairs()
        return (_plain_after_load, (pairs,))

    def __copy__(self) -> CompileState:
        return attrs.evolve(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> CompileState:
        copied = _deepcopy_fields(self, memo, skip="root")
        root = self.root() if self.root is not None else None
        copied_root = memo.get(id(root)) if root is not None else None
        copied.root = weakref.ref(copied_root) if copied_root is not None else None
        return copied


def _deepcopy_fields(obj: Any, memo: dict[int, Any], skip: str = "") -> Any:
    """A copy of the attrs instance ``obj`` with each field but ``skip`` deep-copied (``memo``
    learns the copy first, so cycles through ``obj`` end at it)."""
    copied = object.__new__(type(obj))
    memo[id(obj)] = copied
    for field in attrs.fields(type(obj)):
        if field.name != skip:
            object.__setattr__(copied, field.name, copy.deepcopy(getattr(obj, field.name), memo))
    return copied


def _nothing() -> None:
    return None


def _plain_after_load(pairs: list[tuple[nn.Module, Any]]) -> None:
    """Run when a pickled compiled model is loaded: the regions (loaded before the root's
    state, which pickles last) get their own forwards back and lose torchkiln's records."""
    for module, previous in pairs:
        module.__dict__.pop(REGION_ATTR, None)
        restore_forward(module, previous)


def region_state_of(module: Any) -> RegionState | None:
    """The region state of a module torchkiln compiled as a region, else ``None``."""
    return getattr(module, "__dict__", {}).get(REGION_ATTR)


def state_of(model: Any) -> CompileState | None:
    return getattr(model, "__dict__", {}).get(STATE_ATTR)


def held_regions(holder: Any) -> dict[int, tuple[CompileState, list[RegionState]]]:
    """The compiled regions inside ``holder`` (any module: the compiled root, a submodule taken
    out of it, PEFT's merged model, a wrapper another library put around it), by the state
    they belong to (``id(state) -> (state, regions)``). Compiled state lives on the blocks,
    so it follows them wherever they go."""
    found: dict[int, tuple[CompileState, list[RegionState]]] = {}
    if not isinstance(holder, nn.Module):
        return found
    for module in holder.modules():
        region_state = region_state_of(module)
        if region_state is not None:
            owner = region_state.owner
            found.setdefault(id(owner), (owner, []))[1].append(region_state)
    return found


def decompile_held(holder: nn.Module) -> bool:
    """Decompile the regions inside ``holder`` (see :func:`held_regions`); ``False`` if none.

    When ``holder`` holds every region of a compile, that compile is undone as a whole (its
    settings too, and its state leaves the module it was on); otherwise only the regions
    inside ``holder`` get their own forwards back and leave their compile's report."""
    found = held_regions(holder)
    for state, regions in found.values():
        live = [r for r in state.regions if region_state_of(r.module) is r]
        root = state.root() if state.root is not None else None
        if len(regions) == len(live) and root is not None and state_of(root) is state:
            decompile(root)
            continue
        for region_state in regions:
            _decompile_region(region_state)
            state.regions.remove(region_state)
    return bool(found)


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


def restore_forward(module: nn.Module, previous: Any) -> None:
    if previous is MISSING:
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
    actions: list[Callable[[], None]] = [
        *(functools.partial(_decompile_region, r) for r in state.regions),
        *(functools.partial(restore_forward, m, f) for m, f in reversed(state.replaced_forwards)),
        *reversed(state.restore),
        functools.partial(_untag, root, state),
    ]
    for action in actions:
        try:
            action()
        except Exception as error:
            errors.append(error)
    dynamo_records.forget(set(state.code_names.values()))
    del root.__dict__[STATE_ATTR]
    if errors:
        raise errors[0]
    return True


def _decompile_region(region_state: RegionState) -> None:
    module = region_state.module
    if module.__dict__.get(REGION_ATTR) is region_state:
        restore_forward(module, region_state.previous_forward)
        del module.__dict__[REGION_ATTR]


def _untag(root: nn.Module, state: CompileState) -> None:
    """Drop the Dynamo tags this compile's calls added (not the ones the user had set)."""
    tensors = dict(named_tensors(root))
    in_root = {id(t) for t in tensors.values()}
    for region_state in state.regions:  # regions the user detached from the model since
        prefix = f"{region_state.region.path}." if region_state.region.path else ""
        for name, tensor in named_tensors(region_state.module):
            if id(tensor) not in in_root:
                tensors[prefix + name] = tensor
    for name, tensor in tensors.items():
        if name not in state.tagged_before:
            dynamo.drop_static_address_tag(tensor)


def named_tensors(root: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [
        *root.named_parameters(remove_duplicate=False),
        *root.named_buffers(remove_duplicate=False),
    ]
