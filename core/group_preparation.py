"""What a ``prepare_group`` implementation returns: how one region group is prepared.

The engine applies every preparation it gets for a group, in hook order, and undoes them all on
:func:`torchkiln.decompile` (and when compilation is rolled back).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import attrs
from torch import nn

RegionFunction = Callable[..., Any]
"""``fn(module, *args, **kwargs)``: one region's forward, called with the region's module."""


def _forward_pairs(
    value: tuple[tuple[nn.Module, Callable[..., Any]], ...],
) -> tuple[tuple[nn.Module, Callable[..., Any]], ...]:
    return tuple((module, forward) for module, forward in value)


@attrs.frozen
class GroupPreparation:
    """How one group is prepared before (and around) its compiled function.

    Every field is optional; leave out what you do not need.
    """

    wrap_traced: Callable[[RegionFunction], RegionFunction] | None = None
    """Wraps the group's function ``fn(module, *args, **kwargs)`` *before* it is handed to
    ``compile_region``: the wrapper runs inside Dynamo's trace and costs nothing at run time
    (Dynamo inlines it). Use it to adapt arguments or outputs in traceable code."""
    wrap_call: Callable[[RegionFunction], RegionFunction] | None = None
    """Wraps the *compiled* function. The wrapper runs eagerly on every call of every region in
    the group: a forward-path cost (one Python call), so use it only for what cannot be traced
    (converting a cache object Dynamo cannot handle, say), and document it."""
    trace_settings: Callable[[], AbstractContextManager[Any]] | None = None
    """A context manager factory for settings Dynamo needs while it *traces* the group's
    function (``torch.compiler.config.dynamic_sources``, say). The engine enters it around
    every call that goes through ``torch.compile``'s own entry, where Dynamo may trace: first
    calls, calls that miss every compiled entry (a recompile), and every call under
    ``dispatch="dynamo"``. Calls dispatched directly to compiled code (the default steady
    state, :mod:`torchkiln.dispatch`) skip it, so compile-time settings cost nothing there."""
    forwards: tuple[tuple[nn.Module, Callable[..., Any]], ...] = attrs.field(
        default=(), converter=_forward_pairs
    )
    """``(module, forward)`` pairs: instance-level ``forward`` functions to install on
    submodules (inside the group's regions) for as long as the model stays compiled. The engine
    keeps each module's previous ``forward`` and puts it back on decompile."""
    undo: Callable[[], None] | None = None
    """Called by :func:`torchkiln.decompile` (and on rollback) to undo anything else the
    preparation changed. It must not raise."""
