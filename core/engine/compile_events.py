"""Which region each Dynamo compile happened in, on every call.

The report must stay true after the first calls without torchkiln sitting on the forward path.
Dynamo runs Python only when it compiles, never on a guard hit, and the start of a compile is
observable (``torch._dynamo.callback_handler``'s start callbacks, given the compile id). At that
moment the frame being compiled is an argument of Dynamo's ``_compile`` on the stack; when its
code is a region group's function, its ``module`` local is the region. This module records
``compile id -> region``. (Eager runs, a recompile-limit hit's included, are counted by the
group's function itself: :func:`torchkiln.engine.compile_state.ran_eagerly`. No log is read: what
the report says never depends on log levels.)

The observer is installed when a model is compiled (``torch._dynamo.reset()`` drops Dynamo's
callbacks: a reset after compiling loses the attribution of later compiles until the next
compile), and costs nothing on calls that hit Dynamo's cache. It never raises into Dynamo.
"""

from __future__ import annotations

import sys
import threading
import weakref
from types import CodeType, FrameType
from typing import Any

import attrs

GROUP_CODE_PREFIX = "torchkiln_"
RESUME_PREFIX = "torch_dynamo_resume_in_"


@attrs.define(eq=False)
class CompileEvent:
    """One compile (or limit hit) of a group function, and the region it ran for."""

    compile_id: str
    group_code: str
    """The group function's ``co_name`` (a resume function maps to its group's)."""
    module: weakref.ref[Any] | None


_lock = threading.Lock()
_by_compile_id: dict[tuple[str, str], CompileEvent] = {}
"""(group code, compile id) -> event: compile ids restart after ``torch._dynamo.reset()``,
group code names never repeat in a process."""


def group_code_of(co_name: str) -> str | None:
    """The group function a code name belongs to (itself, or a resume function in it)."""
    if co_name.startswith(RESUME_PREFIX):
        co_name = co_name[len(RESUME_PREFIX) :].rsplit("_at_", 1)[0]
    return co_name if co_name.startswith(GROUP_CODE_PREFIX) else None


def _compiling() -> tuple[CodeType, dict[str, Any]] | None:
    """The code and locals of the frame Dynamo is compiling now (from ``_compile``'s args)."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "_compile":
            f_locals = frame.f_locals
            code, frame_locals = f_locals.get("code"), f_locals.get("locals")
            if isinstance(code, CodeType) and isinstance(frame_locals, dict):
                return code, frame_locals
        frame = frame.f_back
    return None


def _event(compile_id: str) -> CompileEvent | None:
    found = _compiling()
    if found is None:
        return None
    code, frame_locals = found
    group = group_code_of(code.co_name)
    if group is None:
        return None
    module = frame_locals.get("module")
    try:
        ref = weakref.ref(module) if module is not None else None
    except TypeError:
        ref = None
    return CompileEvent(compile_id, group, ref)


def _on_compile_start(args: Any) -> None:
    try:
        event = _event(str(getattr(args, "compile_id", "") or ""))
        if event is not None:
            with _lock:
                _by_compile_id[(event.group_code, event.compile_id)] = event
    except Exception:  # an observer never breaks a compile
        return


def install() -> None:
    """Install the observer (again whenever ``torch._dynamo.reset()``, which clears Dynamo's
    callbacks, dropped it)."""
    import torch._dynamo

    with _lock:
        handler = torch._dynamo.callback_handler
        if _on_compile_start not in handler.start_callbacks:
            handler.register_start_callback(_on_compile_start)


def event_for(group_code: str, compile_id: str) -> CompileEvent | None:
    with _lock:
        return _by_compile_id.get((group_code, compile_id))


def forget(group_codes: set[str]) -> None:
    """Drop what was recorded for these groups (their model was decompiled)."""
    with _lock:
        for key in [k for k, e in _by_compile_id.items() if e.group_code in group_codes]:
            del _by_compile_id[key]


def failed_guards_and_count(code: CodeType, frame_locals: dict[str, Any]) -> tuple[list[str], int]:
    """For each of Dynamo's cached entries for ``code``, the first guard a call with these
    locals fails (Dynamo's own "last reason" names only one entry's), and how many cached
    entries ``code`` has."""
    try:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list

        entries = _debug_get_cache_entry_list(code)
    except Exception:
        return [], 0
    failed = []
    for entry in entries:
        try:
            info = entry.guard_manager.check_verbose(frame_locals)
        except Exception:
            continue
        if not info.result and info.verbose_code_parts:
            failed.append(str(info.verbose_code_parts[0]).strip())
    return failed, len(entries)
