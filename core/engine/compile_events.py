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

import threading
import weakref
from types import CodeType
from typing import Any

import attrs

from torchkiln._internals import cache_entries

GROUP_CODE_PREFIX = "torchkiln_"


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
    co_name = cache_entries.resumed_function_name(co_name)
    return co_name if co_name.startswith(GROUP_CODE_PREFIX) else None


def _event(compile_id: str) -> CompileEvent | None:
    found = cache_entries.frame_being_compiled()
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


def _on_compile_start(compile_id: str) -> None:
    try:
        event = _event(compile_id)
        if event is not None:
            with _lock:
                _by_compile_id[(event.group_code, event.compile_id)] = event
    except Exception:  # an observer never breaks a compile
        return


def install() -> None:
    """Install the observer (again whenever ``torch._dynamo.reset()``, which clears Dynamo's
    callbacks, dropped it)."""
    with _lock:
        cache_entries.on_compile_start(_on_compile_start)


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
        entries = cache_entries.dynamo_guard_table(code, lambda entry_code: entry_code)
    except Exception:
        return [], 0
    failures = entries.first_failures(frame_locals, unexplained=None)
    return [failed.strip() for failed in failures if failed is not None], len(entries)
