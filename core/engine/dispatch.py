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
wrapper turns compiled autograd on around each call. The table of entries is rebuilt whenever Dynamo's count
of entries for the group's code changes (a recompile, ``torch._dynamo.reset()``).

What it leaves out: the profiler's ``Torch-Compiled Region`` range around each block call.
``dispatch="dynamo"`` turns it off (docs/guide.md, "Steady state").
"""

from __future__ import annotations

import dis
import sys
import types
import weakref
from collections.abc import Callable
from typing import Any

_RESUME_PREFIX = "__resume_at_"
"""Names Dynamo gives the functions that continue a frame after a graph break."""


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
        self.entries: list[tuple[Callable[[dict[str, Any]], bool], types.FunctionType]] = []
        self.lean: dict[types.CodeType, types.FunctionType] = {}
        """Per entry's code: the same compiled bytecode without torch's "do not trace" wrappers
        on the helpers it calls (:func:`lean_function`), run while no eval-frame callback is
        set, where those wrappers do nothing."""
        self.reduced = reduced
        """``dispatch="reduced"``: a region whose module tree is unchanged since its last
        fully checked call is checked with torch's reduced guard set only (see the module)."""
        self.reduced_entries: list[tuple[Callable[[dict[str, Any]], bool], types.FunctionType]]
        self.reduced_entries = []
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
        if self.usable and _plain_call():
            count = _ENTRY_COUNT(self.code)
            if count != self.entry_count:
                self._refresh(count)
            if self.usable:
                frame_locals = {"module": module, "args": args, "kwargs": kwargs}
                frame_locals.update(self.free_locals)
                if self.reduced:
                    snapshot = self.verified.get(module)
                    if snapshot is not None and snapshot.unchanged():
                        for check, compiled in self.reduced_entries:
                            if check(frame_locals):
                                self.direct_calls += 1
                                if _EVAL_FRAME_CALLBACK() is None:
                                    compiled = self.lean.get(compiled.__code__, compiled)
                                return compiled(module, *args, **kwargs)
                for check, compiled in self.entries:
                    if check(frame_locals):
                        if self.reduced:  # every guard passed: this module's state is good
                            self.verified[module] = _ModuleSnapshot(module)
                        self.direct_calls += 1
                        if _EVAL_FRAME_CALLBACK() is None:
                            compiled = self.lean.get(compiled.__code__, compiled)
                        return compiled(module, *args, **kwargs)
        return self.guarded(module, *args, **kwargs)

    def _refresh(self, count: int) -> None:
        """Rebuild the table from Dynamo's cache entries for the group's code."""
        from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list

        entries: list[tuple[Callable[[dict[str, Any]], bool], types.FunctionType]] = []
        self.lean = {}
        reduced_entries: list[tuple[Callable[[dict[str, Any]], bool], types.FunctionType]] = []
        for entry in _debug_get_cache_entry_list(self.code):
            code = entry.code
            if any(name.startswith(_RESUME_PREFIX) for name in code.co_names):
                self.usable = False  # a graph break: its continuation is Dynamo's to run
                self.entries = []
                return
            # Keep the guard manager (a Python object) and the code, never the entry itself:
            # Dynamo frees entries on reset and recompile.
            compiled = types.FunctionType(
                code,
                self.function.__globals__,
                self.function.__name__,
                self.function.__defaults__,
                self.function.__closure__,
            )
            entries.append((entry.guard_manager.check, compiled))
            lean = lean_function(compiled)
            if lean is not None:
                self.lean[code] = lean
            reduced_root = getattr(entry.guard_manager, "diff_guard_root", None)
            if reduced_root is not None:
                reduced_entries.append((reduced_root.check, compiled))
        self.entries = entries
        # Reduced guard sets are only valid together (each holds the guards that told the
        # entries apart): one entry without one, and no call takes the reduced path.
        self.reduced_entries = reduced_entries if len(reduced_entries) == len(entries) else []
        self.verified = weakref.WeakKeyDictionary()  # a recompile changed what is guarded
        self.entry_count = count


_LEAN_HELPERS = (
    "record_pregraph_bytecode_enter",
    "record_pregraph_bytecode_exit",
    "call_size",
    "call_stride",
    "call_storage_offset",
)
"""Helpers in ``torch._dynamo.utils`` that compiled bytecode calls (profiler range, tensor
sizes and strides), each wrapped by torch so that Dynamo never traces it."""


class _LeanHelpers:
    """A stand-in for ``torch._dynamo.utils`` in a lean function's globals: the helpers above
    without their wrapper, anything else the module's own."""

    def __init__(self, module: Any):
        self._module = module
        for name in _LEAN_HELPERS:
            helper = getattr(module, name, None)
            if helper is not None:
                setattr(self, name, getattr(helper, "__wrapped__", helper))

    def __getattr__(self, name: str) -> Any:
        if name == "_module":  # missing only while unpickling: no recursion
            raise AttributeError(name)
        return getattr(self._module, name)


def lean_function(compiled: types.FunctionType) -> types.FunctionType | None:
    """``compiled`` (an entry's bytecode as a function) with torch's "do not trace" wrappers
    taken off what it calls: the graph's function (``__compiled_fn_*``, wrapped by
    ``torch._dynamo.disable``) and the helpers of ``torch._dynamo.utils``. Each wrapper swaps
    the eval-frame callback out and back in (about 1-2 us, 3 to 9 times a block call); with
    no callback set, which is when :class:`DirectDispatch` runs the lean function, it does
    nothing else. Its globals hold only the names the bytecode loads, taken now from the
    group function's module (Dynamo installs them there, uniquely named); ``None`` when the
    bytecode defines nested functions or loads a name that is missing."""
    code = compiled.__code__
    if any(isinstance(const, types.CodeType) for const in code.co_consts):
        return None
    source = compiled.__globals__
    lean: dict[str, Any] = {"__builtins__": source.get("__builtins__", __builtins__)}
    changed = False
    for instruction in dis.get_instructions(code):
        if instruction.opname != "LOAD_GLOBAL" or instruction.argval in lean:
            continue
        name = instruction.argval
        if name not in source:
            return None
        value = source[name]
        if name.startswith("__compiled_fn") and getattr(value, "_torchdynamo_disable", False):
            value, changed = getattr(value, "__wrapped__", value), True
        elif getattr(value, "__name__", None) == "torch._dynamo.utils":
            value, changed = _LeanHelpers(value), True
        lean[name] = value
    if not changed:
        return None
    return types.FunctionType(
        code, lean, compiled.__name__, compiled.__defaults__, compiled.__closure__
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


def _plain_call() -> bool:
    """Whether this call may skip ``torch.compile``'s wrapper: not traced by an outer compile,
    under the ``default`` stance with guards evaluated. (Compiled autograd is decided once,
    by :func:`direct_dispatch_hook`: torch reads its setting when ``torch.compile`` builds the
    wrapper, not per call.)"""
    stance = _EVAL_FRAME._stance  # rebound by torch.compiler.set_stance: read it each call
    return stance.stance == "default" and not stance.skip_guard_eval_unsafe and not _IS_COMPILING()


_EVAL_FRAME: Any = None
_DYNAMO_CONFIG: Any = None
_IS_COMPILING: Callable[[], bool] = bool
_ENTRY_COUNT: Callable[[types.CodeType], int] = len  # type: ignore[assignment]
_EVAL_FRAME_CALLBACK: Callable[[], Any] = type(None)
_DICT_VERSION: Callable[[dict[Any, Any]], int] = len


def _bind_torch() -> bool:
    """Look torch's pieces up once (the call path must not import): Dynamo is imported by the
    time a group is compiled, so this costs nothing extra. ``False`` when this torch lacks one
    of them (then groups keep ``torch.compile``'s own wrapper)."""
    global _EVAL_FRAME, _DYNAMO_CONFIG, _IS_COMPILING, _ENTRY_COUNT, _DICT_VERSION
    global _EVAL_FRAME_CALLBACK
    try:
        import torch
        import torch._dynamo.config as dynamo_config
        import torch._dynamo.eval_frame as eval_frame
        from torch._C._dynamo.eval_frame import (
            _debug_get_cache_entry_list,  # noqa: F401  (used by _refresh)
            _get_total_cache_entry_count,
            get_eval_frame_callback,
        )
        from torch._C._dynamo.guards import dict_version

        stance = eval_frame._stance
        stance.stance, stance.skip_guard_eval_unsafe, dynamo_config.compiled_autograd  # noqa: B018
    except (ImportError, AttributeError):
        return False
    _EVAL_FRAME, _DYNAMO_CONFIG = eval_frame, dynamo_config
    _IS_COMPILING, _ENTRY_COUNT = torch.compiler.is_compiling, _get_total_cache_entry_count
    _DICT_VERSION = dict_version
    _EVAL_FRAME_CALLBACK = get_eval_frame_callback
    return True


def direct_dispatch_hook(
    found: dict[str, DirectDispatch], reduced: bool = False
) -> Callable[..., Any]:
    """A :data:`~torchkiln.engine.region_compiler.GroupHook` that installs :class:`DirectDispatch` for
    each group compiled by ``torch.compile`` (anything else, precompiled artifacts or a
    vendor's compiler, is left as it is), recording it in ``found`` by group name."""

    def hook(group: Any, function: Any, compiled: Any) -> Any:
        if getattr(compiled, "_torchdynamo_orig_callable", None) is not function or not isinstance(
            function, types.FunctionType
        ):
            return compiled
        if _EVAL_FRAME is None and not _bind_torch():
            _say_once("this torch lacks Dynamo's cache-entry API", "every group")
            return compiled
        if _DYNAMO_CONFIG.compiled_autograd:
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
