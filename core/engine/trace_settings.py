"""Settings that hold only while Dynamo may trace a group (``GroupPreparation.trace_settings``).

A group's compiled function is what ``torch.compile`` returned; :class:`TraceSettings` wraps it
so that every call through it runs inside the preparations' settings.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from torchkiln.plugin_host.group_preparation import GroupPreparation

SettingsFactory = Callable[[], AbstractContextManager[Any]]


class TraceSettings:
    """``compiled(*args, **kwargs)`` inside every factory's context, first factory outermost.

    Attributes not defined here (``_torchdynamo_orig_callable``, ``aot_compile``, ...) are
    ``compiled``'s, so hooks that look at what ``torch.compile`` returned still see it.
    """

    def __init__(self, compiled: Callable[..., Any], factories: list[SettingsFactory]):
        self.compiled = compiled
        self.factories = factories

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
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


def _nothing() -> None:
    return None
