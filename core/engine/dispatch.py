"""Direct dispatch: a compiled region's steady-state call without ``torch.compile``'s wrapper.

A block call through ``torch.compile`` runs its Python wrapper (``compile_wrapper``: eval-frame
callback, stance, dispatch-key and error-mode bookkeeping), then CPython's frame evaluation
hands the frame to Dynamo's C callback, which checks each cache entry's guards and runs the
matching entry's compiled bytecode. A full compile pays that once per forward; regions pay it
once per block call.

:class:`DirectDispatch` does the same lookup itself, per group: it evaluates each cache entry's
guards with Dynamo's own guard manager (all of them: the same check Dynamo makes, so the same
inputs recompile) and runs the matching entry's compiled bytecode as a plain function. On any
miss, and whenever the fast path could differ from Dynamo's (an outer trace, a stance other
than ``default``, an entry with a graph break), it calls the
``torch.compile`` wrapper instead, which recompiles, records the recompile and applies the
stance exactly as without torchkiln. A group compiled while
``torch._dynamo.config.compiled_autograd`` is on keeps the wrapper for every call: that
wrapper turns compiled autograd on around each call. The table of entries (a
:class:`~torchkiln._internals.cache_entries.GuardTable`, the one the precompiled forms use too)
is rebuilt whenever Dynamo's count of entries for the group's code changes (a recompile,
``torch._dynamo.reset()``).

What it leaves out: the profiler's ``Torch-Compiled Region`` range around each block call.
``dispatch="dynamo"`` turns it off (docs/guide.md, "Steady state").
"""

from __future__ import annotations

import sys
import types
import weakref
from collections.abc import Callable
from typing import Any

from torchkiln._internals import cache_entries
from torchkiln._internals.cache_entries import GuardTable


class DirectDispatch:
    """``dispatch(module, *args, **kwargs)``: one group's compiled function, dispatched directly.

    ``guarded`` is what ``torch.compile`` returned for ``function`` (the group's function);
    every call this class does not run itself goes to it.
    """

    def __init__(
        self, function: types.FunctionType, guarded: Callable[..., Any], reduced: bool = False
    ):
        self.code = function.__code__
        self.function = function
        self.guarded = guarded
        self.entries: GuardTable[types.FunctionType] = GuardTable()
        """Dynamo's cache entries for the group's code: each one's guards and bytecode."""
        self.lean: dict[types.CodeType, types.FunctionType] = {}
        """Per entry's code: the same compiled bytecode without torch's "do not trace" wrappers
        on the helpers it calls (:func:`~torchkiln._internals.cache_entries.lean_function`), run
        while no eval-frame callback is set, where those wrappers do nothing."""
        self.reduced = reduced
        """``dispatch="reduced"``: a region whose module tree is unchanged since its last
        fully checked call is checked with torch's reduced guard set only (see the module)."""
        self.reduced_entries: GuardTable[types.FunctionType] = GuardTable()
        self.verified: weakref.WeakKeyDictionary[Any, _ModuleSnapshot]
        self.verified = weakref.WeakKeyDictionary()
        self.entry_count = 0
        self.direct_calls = 0
        """Calls run on the direct path (tests and the docs' example read it)."""
        self.usable = True
        """``False`` once an entry is found that the direct path must not run (a graph
        break: its continuation must go through Dynamo)."""
        # Free variables are frame locals too, and Dynamo's guards read them (``forward``).
        self.free_locals = {
            name: cell.cell_contents
            for name, cell in zip(self.code.co_freevars, function.__closure__ or (), strict=True)
        }

    def __deepcopy__(self, memo: dict[int, Any]) -> DirectDispatch:
        return self  # shared by copies, as the compiled function is (functions copy as is)

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (_nothing, ())  # a pickled model holds the plain model (CompileState)

    def __call__(self, module: Any, /, *args: Any, **kwargs: Any) -> Any:
        if self.usable and _PLAIN_CALL():
            count = _ENTRY_COUNT(self.code)
            if count != self.entry_count:
                self._refresh(count)
            if self.usable:
                frame_locals = {"module": module, "args": args, "kwargs": kwargs}
                frame_locals.update(self.free_locals)
                compiled = None
                if self.reduced:
                    snapshot = self.verified.get(module)
                    if snapshot is not None and snapshot.unchanged():
                        compiled = self.reduced_entries.find(frame_locals)
                if compiled is None:
                    compiled = self.entries.find(frame_locals)
                    if compiled is not None and self.reduced:
                        # every guard passed: this module's state is good
                        self.verified[module] = _ModuleSnapshot(module)
                if compiled is not None:
                    self.direct_calls += 1
                    if _EVAL_FRAME_CALLBACK() is None:
                        compiled = self.lean.get(compiled.__code__, compiled)
                    return compiled(module, *args, **kwargs)
        return self.guarded(module, *args, **kwargs)

    def _refresh(self, count: int) -> None:
        """Rebuild the table from Dynamo's cache entries for the group's code."""
        entries = cache_entries.dynamo_guard_table(self.code, self._as_function)
        functions = entries.functions()
        self.lean = {}
        if any(cache_entries.continues_after_graph_break(f.__code__) for f in functions):
            self.usable = False  # a graph break: its continuation is Dynamo's to run
            self.entries = GuardTable()
            return
        for compiled in functions:
            lean = cache_entries.lean_function(compiled)
            if lean is not None:
                self.lean[compiled.__code__] = lean
        self.entries = entries
        # Reduced guard sets are only valid together (each holds the guards that told the
        # entries apart): one entry without one, and no call takes the reduced path.
        self.reduced_entries = entries.reduced()
        self.verified = weakref.WeakKeyDictionary()  # a recompile changed what is guarded
        self.entry_count = count

    def _as_function(self, code: types.CodeType) -> types.FunctionType:
        """An entry's compiled bytecode as a function of the group function's globals,
        defaults and closure."""
        function = self.function
        return types.FunctionType(
            code,
            function.__globals__,
            function.__name__,
            function.__defaults__,
            function.__closure__,
        )


class _ModuleSnapshot:
    """The version of every dict of a region's module tree (each module's ``__dict__`` and
    the dicts in it: ``_parameters``, ``_buffers``, ``_modules``, hooks). Setting, adding or
    deleting an attribute, parameter, buffer, submodule or hook changes one."""

    __slots__ = ("dicts", "versions")

    def __init__(self, module: Any):
        dicts = []
        for submodule in module.modules():
            attributes = submodule.__dict__
            dicts.append(attributes)
            dicts.extend(value for value in attributes.values() if isinstance(value, dict))
        self.dicts = dicts
        self.versions = list(map(_DICT_VERSION, dicts))

    def unchanged(self) -> bool:
        return list(map(_DICT_VERSION, self.dicts)) == self.versions


def _nothing() -> None:
    return None


_BOUND = False
_PLAIN_CALL: Callable[[], bool] = bool
"""Whether this call may skip ``torch.compile``'s wrapper: not traced by an outer compile,
under the ``default`` stance with guards evaluated. (Compiled autograd is decided once, by
:func:`direct_dispatch_hook`: torch reads its setting when ``torch.compile`` builds the
wrapper, not per call.)"""
_ENTRY_COUNT: Callable[[types.CodeType], int] = len  # type: ignore[assignment]
_EVAL_FRAME_CALLBACK: Callable[[], Any] = type(None)
_DICT_VERSION: Callable[[dict[Any, Any]], int] = len


def _bind_torch() -> bool:
    """Look torch's pieces up once (the call path must not import): Dynamo is imported by the
    time a group is compiled, so this costs nothing extra. ``False`` when this torch lacks one
    of them (then groups keep ``torch.compile``'s own wrapper)."""
    global _BOUND, _PLAIN_CALL, _ENTRY_COUNT, _EVAL_FRAME_CALLBACK, _DICT_VERSION
    plain_call = cache_entries.plain_call_check()
    entry_count = cache_entries.cache_entry_counter()
    callback = cache_entries.eval_frame_callback_getter()
    dict_version = cache_entries.dict_version_getter()
    if plain_call is None or entry_count is None or callback is None or dict_version is None:
        return False
    _PLAIN_CALL, _ENTRY_COUNT = plain_call, entry_count
    _EVAL_FRAME_CALLBACK, _DICT_VERSION = callback, dict_version
    _BOUND = True
    return True


def direct_dispatch_hook(
    found: dict[str, DirectDispatch], reduced: bool = False
) -> Callable[..., Any]:
    """A :data:`~torchkiln.engine.region_compiler.GroupHook` that installs :class:`DirectDispatch` for
    each group compiled by ``torch.compile`` (anything else, precompiled artifacts or a
    vendor's compiler, is left as it is), recording it in ``found`` by group name."""

    def hook(group: Any, function: Any, compiled: Any) -> Any:
        if cache_entries.torch_compile_original(compiled) is not function or not isinstance(
            function, types.FunctionType
        ):
            return compiled
        if not _BOUND and not _bind_torch():
            _say_once("this torch lacks Dynamo's cache-entry API", "every group")
            return compiled
        if cache_entries.compiled_autograd_enabled():
            # torch.compile's wrapper (built just now, with this setting) turns compiled
            # autograd on around every call; only that wrapper may run the group.
            _say_once("torch._dynamo.config.compiled_autograd is on", f"group {group.name!r}")
            return compiled
        try:
            dispatch = DirectDispatch(function, compiled, reduced)
        except (AttributeError, TypeError, ValueError) as error:  # a function of another shape
            _say_once(f"{type(error).__name__}: {error}", f"group {group.name!r}")
            return compiled
        found[group.name] = dispatch
        return _as_function(dispatch, getattr(compiled, "__name__", "forward"))

    return hook


_SAID: set[str] = set()


def _say_once(reason: str, scope: str) -> None:
    """Direct dispatch is an optimisation: when it cannot be set up the group keeps
    ``torch.compile``'s wrapper, and says so once."""
    if reason in _SAID:
        return
    _SAID.add(reason)
    print(
        f"torchkiln: direct dispatch is off for {scope} ({reason}); it runs through "
        "torch.compile's wrapper",
        file=sys.stderr,
    )


def _as_function(dispatch: DirectDispatch, name: str) -> Callable[..., Any]:
    """A plain function around ``dispatch`` (bound per region with ``types.MethodType``)."""

    def forward(module: Any, /, *args: Any, **kwargs: Any) -> Any:
        return dispatch(module, *args, **kwargs)

    forward.__name__ = forward.__qualname__ = name
    return forward
