"""What the plugin manager records and reports about plugins (``torchkiln plugins``): their
names, what each registered plugin implements, the ones that failed to load, the names they
declare; and the check that a declaration hook returned its spec type.
"""

from __future__ import annotations

import types
from typing import Any, Generic, NamedTuple, TypeVar

import attrs

from torchkiln.errors import PluginError
from torchkiln.plugin_host.declarations import (
    BackendSpec,
    DistributedSpec,
    LayerCacheSpec,
    SelectorSpec,
)
from torchkiln.plugin_host.plugin_faults import shown

SpecT = TypeVar("SpecT", BackendSpec, SelectorSpec, DistributedSpec, LayerCacheSpec)


def builtin_name(module_name: str) -> str:
    """``torchkiln.plugins.backends`` is registered as ``torchkiln.backends``."""
    return "torchkiln." + module_name.rsplit(".", 1)[-1]


def readable_name(plugin: object) -> str:
    """The name an unnamed registration gets: a module's name, else the object's class path."""
    if isinstance(plugin, types.ModuleType):
        return plugin.__name__
    cls = plugin if isinstance(plugin, type) else type(plugin)
    return f"{cls.__module__}.{cls.__qualname__}"


class Declaration(NamedTuple):
    """What a declaration hook declares: its ``kind`` in messages, its spec type, and the hook
    the declaring plugin must implement for a declared name to be usable (``None``: none)."""

    kind: str
    spec_type: type
    serving_hook: str | None


DECLARATIONS = {
    "declare_backends": Declaration("backend", BackendSpec, "compile_region"),
    "declare_selectors": Declaration("selector", SelectorSpec, "select_regions"),
    "declare_distributed": Declaration("distributed strategy", DistributedSpec, "wrap_distributed"),
    "declare_layer_caches": Declaration("layer cache", LayerCacheSpec, None),
}


def declaration_of(spec: object) -> Declaration:
    """The :class:`Declaration` of the hook that declares specs like ``spec``."""
    return next(d for d in DECLARATIONS.values() if isinstance(spec, d.spec_type))


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
    """A plugin that could not be loaded, or was quarantined because a declaration hook
    failed, and why (same keys as :class:`PluginInfo`, plus ``hook``)."""

    name: str
    """The entry-point name (or the registered name of a quarantined registered plugin)."""
    target: str | None
    """What the entry point loads (``module:attribute``); ``None`` for a registered plugin."""
    distribution: str | None
    version: str | None
    error: str
    hook: str | None = None
    """The declaration hook that failed (the plugin was quarantined), or ``None``: it failed
    to load (import, or validation at registration)."""

    def describe(self) -> str:
        dist = (
            f"{self.distribution} {self.version}" if self.distribution else "unknown distribution"
        )
        where = f" = {self.target!r} (from {dist})" if self.target else ""
        if self.hook is None:
            return f"torchkiln plugin {self.name!r}{where} failed to load and was skipped: {self.error}"
        return (
            f"torchkiln plugin {self.name!r}{where} was quarantined (its names are unavailable, "
            f"every other plugin is unaffected): its {self.hook}() {self.error}"
        )

    @property
    def reason(self) -> str:
        """One short phrase for lists: ``declare_backends() raised ValueError: ...``."""
        return self.error if self.hook is None else f"{self.hook}() {self.error}"


@attrs.frozen
class Declared(Generic[SpecT]):
    """A declared backend, selector, strategy or layer cache, with the plugin that declared it."""

    spec: SpecT
    plugin: str


class DeclarationFailed(PluginError):
    """A declaration hook raised or returned the wrong type; ``detail`` says which, without
    the plugin's name (``raised ValueError: ...``, ``returned dict {...}; expected ...``)."""

    def __init__(self, plugin: str, hook: str, detail: str):
        super().__init__(f"plugin {plugin!r}: {hook}() {detail}", plugin=plugin, hook=hook)
        self.detail = detail


def check_specs(hook_name: str, plugin: str, specs: Any) -> None:
    """A declaration hook returns a list (or tuple) of its spec type: anything else is the
    plugin's fault, named as such (a bare ``AttributeError`` on ``.name`` helps nobody)."""
    kind = DECLARATIONS[hook_name].spec_type
    if isinstance(specs, list | tuple) and all(isinstance(spec, kind) for spec in specs):
        return
    expected = f"expected a list of torchkiln.plugin.{kind.__name__}"
    if isinstance(specs, list | tuple):
        bad = next(s for s in specs if not isinstance(s, kind))
        what = f"{type(specs).__name__} containing {type(bad).__name__} {shown(bad)}"
    else:
        what = f"{type(specs).__name__} {shown(specs)}"
    raise DeclarationFailed(plugin, hook_name, f"returned {what}; {expected}")
