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
    value: tuple[tuple[nn.Module, Callable[..., Any] | None], ...],
) -> tuple[tuple[nn.Module, Callable[..., Any] | None], ...]:
    """``forwards`` as a tuple of pairs; anything else is refused here, when the plugin builds
    its preparation, rather than at the first call of a compiled region."""
    allowed = "an iterable of (nn.Module, forward function) pairs"
    if isinstance(value, str | bytes) or not hasattr(value, "__iter__"):
        raise TypeError(f"GroupPreparation.forwards must be {allowed}, got {_described(value)}")
    pairs = []
    for index, pair in enumerate(value):
        if not (isinstance(pair, tuple | list) and len(pair) == 2):
            raise TypeError(
                f"GroupPreparation.forwards[{index}] must be an (nn.Module, forward function) "
                f"pair, got {_described(pair)}"
            )
        module, forward = pair
        if not isinstance(module, nn.Module):
            raise TypeError(
                f"GroupPreparation.forwards[{index}][0] must be an nn.Module, got "
                f"{_described(module)}"
            )
        if forward is not None and not callable(forward):
            raise TypeError(
                f"GroupPreparation.forwards[{index}][1] must be a callable forward or None, got "
                f"{_described(forward)}"
            )
        pairs.append((module, forward))
    return tuple(pairs)


def _lines(value: Any) -> tuple[str, ...]:
    """``notes`` as a tuple of strings; anything else is refused when the preparation is built."""
    if isinstance(value, str) or not all(isinstance(line, str) for line in value):
        raise TypeError(
            f"GroupPreparation.notes must be an iterable of str, got {_described(value)}"
        )
    return tuple(value)


def _described(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _optional_callable(what: str) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    """An attrs validator: ``None`` or a callable, else a ``TypeError`` naming the field and
    what it takes (``what``)."""

    def check(_instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is not None and not callable(value):
            raise TypeError(
                f"GroupPreparation.{attribute.name} must be None or {what}, got {_described(value)}"
            )

    return check


@attrs.frozen
class GroupPreparation:
    """How one group is prepared before (and around) its compiled function.

    Every field is optional; leave out what you do not need. Each is checked when the
    preparation is built: a value of the wrong kind raises ``TypeError`` naming the field.
    """

    wrap_traced: Callable[[RegionFunction], RegionFunction] | None = attrs.field(
        default=None, validator=_optional_callable("a function that wraps the group's function")
    )
    """Wraps the group's function ``fn(module, *args, **kwargs)`` *before* it is handed to
    ``compile_region``: the wrapper runs inside Dynamo's trace and costs nothing at run time
    (Dynamo inlines it). Use it to adapt arguments or outputs in traceable code."""
    wrap_call: Callable[[RegionFunction], RegionFunction] | None = attrs.field(
        default=None, validator=_optional_callable("a function that wraps the compiled function")
    )
    """Wraps the *compiled* function. The wrapper runs eagerly on every call of every region in
    the group: a forward-path cost (one Python call), so use it only for what cannot be traced
    (converting a cache object Dynamo cannot handle, say), and document it."""
    trace_settings: Callable[[], AbstractContextManager[Any]] | None = attrs.field(
        default=None, validator=_optional_callable("a factory of context managers")
    )
    """A context manager factory for settings Dynamo needs while it *traces* the group's
    function (``torch.compiler.config.dynamic_sources``, say). The engine enters it while
    Dynamo compiles the group's code, from the compile's start to its end (recompiles and
    resume functions included), and around the compile of a saved function; a call that runs
    compiled code does not enter it."""
    forwards: tuple[tuple[nn.Module, Callable[..., Any] | None], ...] = attrs.field(
        default=(), converter=_forward_pairs
    )
    """``(module, forward)`` pairs: instance-level ``forward`` functions to install on the
    group's modules or their submodules for as long as the model stays compiled; ``None``
    takes the module's instance ``forward`` off (its class's runs). The engine keeps each
    module's previous ``forward`` and puts it back on decompile."""
    undo: Callable[[], None] | None = attrs.field(
        default=None, validator=_optional_callable("a function taking no arguments")
    )
    """Called by :func:`torchkiln.decompile` (and on rollback) to undo anything else the
    preparation changed. It must not raise."""
    notes: tuple[str, ...] = attrs.field(default=(), converter=_lines)
    """Lines for the report (``CompileReport.notes``): what the preparation runs outside the
    compiled code, and why."""
