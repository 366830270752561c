"""Saved compiled code a source loaded, and the one rule for whether it fits a call.

A group's entries (from the store, a peer rank, an artifact directory) and the root's
whole-model form are the same kind of thing: :class:`SavedCode`, functions saved by
``torch.compiler`` with their guards, tried in order. A call *fits* when a function's saved
guards pass for the call's frame locals (the function's closure, ``module``, ``args``,
``kwargs``); the first that passes runs. Keys and hashes only name directories: nothing else
decides. A call none fits is a miss, explained by the first guard each function failed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
from torch import nn

from torchkiln._internals.aot_artifacts import loaded_guard_table

REASON_CHARS = 300
"""A failing guard is cut to this many characters in a miss's reason."""


@attrs.define(eq=False)
class SavedCode:
    """Saved compiled functions from one source, tried in order by their saved guards."""

    source: str
    """Where they came from, for the report (``store``, ``rank 0``, ``artifacts DIR``, a
    whole-model form's directory)."""
    functions: list[tuple[str, Callable[..., Any]]]
    """``(kind, function)`` as ``torch.compiler.load_compiled_function`` returned them."""
    closure: dict[str, Any] = attrs.Factory(dict)
    """The compiled function's closure, by name: torch's guards read it as frame locals."""
    on_miss: Callable[[str | None], None] = lambda reason: None
    """Called on each call none fits (``reason`` on the first only); may raise."""
    compiled_here: bool = False
    """Whether this process compiled them, at this call (the rank that compiled a job's entry
    loads it as the others do): a group is then ``compiled``, not ``serving``."""
    load_seconds: float | None = None
    """What loading took, where the source measured it."""
    write_back: Callable[..., tuple[list[tuple[str, Callable[..., Any]]], bool] | None] | None = (
        None
    )
    """For a source that is also written (a store): ``write_back(module, args, kwargs)``
    compiles an entry for a call none of these functions fits, saves it there and returns its
    loaded functions and ``True``; or the functions of an entry the source received since that
    fits the call and ``False`` (nothing compiled); or ``None``: neither (the backend's code
    then serves the call)."""
    written: int = 0
    """How many missed calls ran an entry :meth:`add_written` compiled and wrote for them."""
    found: int = 0
    """How many missed calls ran an entry the source received since these were loaded (another
    process wrote it), compiling nothing."""
    _table: Any = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self._table = loaded_guard_table(fn for _, fn in self.functions)

    def add_written(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Callable[..., Any] | None:
        """A missed call compiled into a new entry of the source (:attr:`write_back`), whose
        functions join these (later calls of its family fit them); its function, or ``None``
        when the source cannot write one (it is then not asked again)."""
        if self.write_back is None:
            return None
        added = self.write_back(module, args, kwargs)
        if added is None:
            self.write_back = None  # one failure is enough: the backend serves the misses
            return None
        functions, compiled = added
        self.functions = [*self.functions, *functions]
        self._table = loaded_guard_table(fn for _, fn in self.functions)
        fn = self.find(self.frame_locals(module, args, kwargs))
        if fn is not None:
            self.written += compiled
            self.found += not compiled
        return fn

    def frame_locals(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        """What the saved guards read: the closure and the call (the compiled function's
        ``module, *args, **kwargs``)."""
        return {**self.closure, "module": module, "args": args, "kwargs": kwargs}

    def find(self, f_locals: dict[str, Any]) -> Callable[..., Any] | None:
        """The first function whose saved guards pass (called like the compiled function, with
        no guard check of its own); ``None``: a miss."""
        return self._table.find(f_locals)

    def first_failures(self, f_locals: dict[str, Any]) -> list[str | None]:
        """Per function, the first guard that fails for ``f_locals`` (``None``: it fits)."""
        return self._table.first_failures(f_locals)

    def why_not(self, f_locals: dict[str, Any]) -> str:
        """``inference: <first failing guard>; training: ...``: why no function fits."""
        return "; ".join(
            f"{kind}: {(failed or 'guards pass')[:REASON_CHARS]}"
            for (kind, _), failed in zip(self.functions, self.first_failures(f_locals), strict=True)
        )

    def covered_calls(self) -> list[str]:
        """Per function, the call family its saved guards admit (``args[0] int64[1, 12]``)."""
        return self._table.covered_calls()

    def kinds(self) -> str:
        """``inference, training``: the kinds of call saved, each once."""
        return ", ".join(dict.fromkeys(kind for kind, _ in self.functions))
