"""A region group's code: docs/architecture.md, "A block's call".

A region's runtime (:mod:`~torchkiln.engine.region_runtime`) calls its group's code: the
backend's compiled function, or a :class:`GroupCode` when sources may have code for it.

1. A ``GroupCode``'s first call asks its sources in order (:class:`CodeSource`: the store or
   a peer rank, a precompiled directory); the first that has code serves the group.
2. Each call runs the first loaded function whose saved guards pass; a call none fits (or a
   group no source had code for) runs the backend's code, built on the first such call. A
   loaded function that missed one call serves every later call it fits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import attrs
from torch import nn

from torchkiln.engine.compile_state import REGION_ATTR, _nothing
from torchkiln.engine.miss_log import MissLog
from torchkiln.engine.saved_code import SavedCode
from torchkiln.engine.states import State, describe
from torchkiln.plugin_host.group_preparation import GroupPreparation, RegionFunction
from torchkiln.plugin_host.region_plan import RegionGroup

# --- the settings a group's code runs in (``GroupPreparation.trace_settings``) ------------------


SettingsFactory = Callable[[], AbstractContextManager[Any]]


class TraceSettings:
    """``compiled(*args, **kwargs)`` inside every factory's context, first factory outermost.

    What a group function compiled to be saved carries (``aot_compile`` is traced inside
    :meth:`entered`), and the call path of an instance ``forward`` compiled on its own. The
    group's own code is not wrapped: Dynamo's compiles of it enter the settings
    (:func:`torchkiln.engine.dynamo_records.trace_while_compiling`), and its calls none.

    Attributes not defined here (``_torchdynamo_orig_callable``, ``aot_compile``, ...) are
    ``compiled``'s, so hooks that look at what ``torch.compile`` returned still see it.
    """

    def __init__(self, compiled: Callable[..., Any], factories: list[SettingsFactory]):
        self.compiled = compiled
        self.factories = factories

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # One settings context (the usual case) is entered directly, without an ExitStack
        # and a frame of its own (principle 6).
        factories = self.factories
        if len(factories) == 1:
            with factories[0]():
                return self.compiled(*args, **kwargs)
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
class GroupCall:
    """A group's first call, as its sources see it."""

    group: RegionGroup
    shared: RegionFunction
    """The group's function (the code every loaded function was compiled from)."""
    module: nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    build_savable: Callable[..., Any]
    """``build_savable(dynamic=None)``: the group function under the backend with ``fullgraph``
    set (what torch can save); ``dynamic`` overrides the configured value."""
    code: GroupCode


class CodeSource:
    """A place a group's compiled code may come from, before the backend compiles it."""

    name = "source"

    def attach(self, group: RegionGroup, shared: RegionFunction) -> bool:
        """At compile time: whether to ask this source at the group's first call."""
        return True

    def load(self, call: GroupCall) -> SavedCode | None:
        """At the group's first call: its loaded code, or ``None`` (the next source is asked)."""
        raise NotImplementedError


class GroupCode:
    """A group's function ``fn(module, *args, **kwargs)`` served by its sources' code.

    ``state`` (:class:`~torchkiln.engine.states.State`): ``pending`` until the first call, then
    ``serving`` (a source's functions, the backend's code for the calls they do not fit) or
    ``compiled`` (no source had code: the backend's code serves every call)."""

    def __init__(
        self,
        group: RegionGroup,
        shared: RegionFunction,
        sources: list[CodeSource],
        build: Callable[[], RegionFunction],
        build_savable: Callable[..., Any],
    ):
        self.group = group
        self.shared = shared
        self.sources = sources
        self._build = build
        self._build_savable = build_savable
        self.state = State.PENDING
        self.loaded: SavedCode | None = None
        self._built: RegionFunction | None = None
        self.hits = 0
        self.missed = MissLog()
        """The calls no loaded function fit, by the first guard each function failed."""
        self.frozen: Any = None
        """The model's :class:`~torchkiln.engine.serving.Freeze` once frozen: then a call no
        loaded function fits is the freeze's to refuse or run eagerly, never compiled."""

    def __call__(self, module: nn.Module, /, *args: Any, **kwargs: Any) -> Any:
        if self.state is State.PENDING:
            self._first(module, args, kwargs)
        loaded = self.loaded
        if loaded is not None:
            f_locals = {**loaded.closure, "module": module, "args": args, "kwargs": kwargs}
            fn = loaded.find(f_locals)
            if fn is not None:
                self.hits += 1
                return fn(module, *args, **kwargs)
            self._miss(loaded, f_locals)
            if self.frozen is None and (fn := loaded.add_written(module, args, kwargs)):
                return fn(module, *args, **kwargs)
        if self._built is None:
            if self.frozen is not None:
                return self._uncovered(module, args, kwargs)
            self._built = self._build()
        return self._built(module, *args, **kwargs)

    def _uncovered(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A frozen model's call that no loaded function fits (and no backend code was built
        before the freeze): the freeze refuses it or runs it eagerly, naming the guards."""
        guards: list[str] = []
        if self.loaded is not None:
            f_locals = self.loaded.frame_locals(module, args, kwargs)
            guards = [failed for failed in self.loaded.first_failures(f_locals) if failed]
        return self.frozen.uncovered(module.__dict__[REGION_ATTR], guards, args, kwargs)

    def line(self) -> str:
        """The report's line for this group's code."""
        if self.loaded is None:
            return f"{self.group.name}: {self.state}"
        functions, written, found = self.loaded.functions, self.loaded.written, self.loaded.found
        backend = self.misses - written - found
        built = f"; {backend} ran the backend's code" if backend else ""
        if written:
            built += f"; {written} compiled and written to the store"
        if found:
            built += f"; {found} fit entries another process wrote to the store since"
        missed = "".join(f"\n{line}" for line in self.missed.lines())
        return (
            f"{self.group.name}: {describe(self.state, self.loaded.source)} ({len(functions)} "
            f"functions: {self.loaded.kinds()}): {self.hits} calls fit{built}{missed}"
        )

    def _first(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        call = GroupCall(self.group, self.shared, module, args, kwargs, self._build_savable, self)
        for source in self.sources:
            loaded = source.load(call)
            if loaded is not None:
                self.loaded = loaded
                self.state = State.COMPILED if loaded.compiled_here else State.SERVING
                return
        self.state = State.COMPILED

    def covered_calls(self) -> list[str]:
        """The call family each loaded function's saved guards admit (none before loading)."""
        return self.loaded.covered_calls() if self.loaded is not None else []

    @property
    def misses(self) -> int:
        return self.missed.total

    def _miss(self, loaded: SavedCode, f_locals: dict[str, Any]) -> None:
        reason = loaded.why_not(f_locals) if self.missed.wants_reason() else None
        first = self.missed.total == 0
        self.missed.add(reason)
        loaded.on_miss(reason if first else None)
