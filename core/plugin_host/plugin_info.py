"""What the plugin manager records and reports about plugins (``torchkiln plugins``): their
names, what each registered plugin implements, the ones that failed to load, the names they
declare; and the check that a declaration hook returned its spec type.
"""

from __future__ import annotations

import types
from typing import Any, Generic, TypeVar

import attrs

from torchkiln.errors import PluginError
from torchkiln.plugin_host.declarations import (
    BackendSpec,
    DistributedSpec,
    LayerCacheSpec,
    SelectorSpec,
)

SpecT = TypeVar("SpecT", BackendSpec, SelectorSpec, DistributedSpec, LayerCacheSpec)


def builtin_name(module_name: str) -> str:
    """``torchkiln.plugins.backends`` is registered as ``torchkiln.backends``."""
    return "torchkiln." + module_name.rsplit(".", 1)[-1]


def readable_name(plugin: object) -> str:
    """The name an unnamed registration gets: a module's name, else the object's class path."""
    if isinstance(plugin, types.ModuleType):
        return plugin.__name__
    if isinstance(plugin, type):
        return f"{plugin.__module__}.{plugin.__qualname__}"
    cls = type(plugin)
    return f"{cls.__module__}.{cls.__qualname__}"


IMPLEMENTING_HOOK = {
    "declare_backends": "compile_region",
    "declare_selectors": "select_regions",
    "declare_distributed": "wrap_distributed",
}
"""A plugin that declares names must implement the hook that serves them."""


@attrs.frozen
class PluginInfo:
    """What ``torchkiln plugins`` shows about one registered plugin.

    JSON keys (``torchkiln plugins --json``) are these field names, with one meaning each.
    """

    name: str
    """The registered name: ``torchkiln.<module>`` for a built-in, the entry-point name for an
    installed plugin, the given (or :func:`readable_name`) name for a registered one."""
    kind: str
    """``builtin``, ``entry-point`` or ``registered``."""
    hooks: tuple[str, ...]
    distribution: str | None = None
    version: str | None = None
    target: str | None = None
    """What the entry point loads (``module:attribute``); ``None`` unless ``kind`` is
    ``entry-point``."""

    @property
    def builtin(self) -> bool:
        return self.kind == "builtin"


@attrs.frozen
class FailedPlugin:
    """An external plugin that could not be loaded, and why (same keys as :class:`PluginInfo`)."""

    name: str
    """The entry-point name."""
    target: str
    """What the entry point loads (``module:attribute``)."""
    distribution: str | None
    version: str | None
    error: str

    def describe(self) -> str:
        dist = (
            f"{self.distribution} {self.version}" if self.distribution else "unknown distribution"
        )
        return (
            f"torchkiln plugin {self.name!r} = {self.target!r} (from {dist}) failed to "
            f"load and was skipped: {self.error}"
        )


@attrs.frozen
class Declared(Generic[SpecT]):
    """A declared backend, selector, strategy or layer cache, with the plugin that declared it."""

    spec: SpecT
    plugin: str


_SPEC_TYPES = {
    "declare_backends": BackendSpec,
    "declare_selectors": SelectorSpec,
    "declare_distributed": DistributedSpec,
    "declare_layer_caches": LayerCacheSpec,
}


def check_specs(hook_name: str, plugin: str, specs: Any) -> None:
    """A declaration hook returns a list (or tuple) of its spec type: anything else is the
    plugin's fault, named as such (a bare ``AttributeError`` on ``.name`` helps nobody)."""
    kind = _SPEC_TYPES[hook_name]
    if isinstance(specs, list | tuple) and all(isinstance(spec, kind) for spec in specs):
        return
    bad = (
        next((s for s in specs if not isinstance(s, kind)), specs)
        if isinstance(specs, list | tuple)
        else specs
    )
    shown = repr(bad)
    raise PluginError(
        f"plugin {plugin!r}'s {hook_name}() returned {type(specs).__name__} containing "
        f"{type(bad).__name__} {shown[:80]}; expected a list of torchkiln.{kind.__name__}"
        if bad is not specs
        else f"plugin {plugin!r}'s {hook_name}() returned {type(specs).__name__} {shown[:80]}; "
        f"expected a list of torchkiln.{kind.__name__}",
        plugin=plugin,
        hook=hook_name,
    )
