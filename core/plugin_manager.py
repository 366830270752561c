"""The plugin manager: built-in plugins, entry-point plugins, environment controls.

Environment variables (read when a manager is created):

``TORCHKILN_DISABLE_PLUGIN_AUTOLOAD=1``
    load no plugin from the ``torchkiln`` entry-point group.
``TORCHKILN_PLUGINS=a,b``
    load only these external plugins. Names are **entry-point names** (the key in a
    distribution's ``[project.entry-points.torchkiln]`` table), not distribution names.
``TORCHKILN_DISABLED_PLUGINS=x,y``
    block these: entry-point names of external plugins, or registered names of built-ins
    (``torchkiln.tensorrt``).
``TORCHKILN_STRICT_PLUGINS=1``
    a plugin that fails to import or to validate raises :class:`~torchkiln.PluginError`
    instead of being skipped with a warning.
``TORCHKILN_TRACE_PLUGINS=1``
    print each hook call, its arguments and its result to stderr.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from importlib import metadata
from typing import Any, Generic, TypeVar

import attrs
import pluggy

from torchkiln import hooks
from torchkiln.declarations import BackendSpec, DistributedSpec, SelectorSpec
from torchkiln.errors import PluginError
from torchkiln.plugins import BUILTIN_PLUGINS
from torchkiln.torch_backends import torch_backend_names

ENTRY_POINT_GROUP = "torchkiln"
_TRUE = frozenset({"1", "true", "yes", "on"})

SpecT = TypeVar("SpecT", BackendSpec, SelectorSpec, DistributedSpec)


def env_flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() in _TRUE


def env_names(env: Mapping[str, str], name: str) -> set[str] | None:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return None
    return {part.strip() for part in raw.split(",") if part.strip()}


def builtin_name(module_name: str) -> str:
    """``torchkiln.plugins.backends`` is registered as ``torchkiln.backends``."""
    return "torchkiln." + module_name.rsplit(".", 1)[-1]


@attrs.frozen
class PluginInfo:
    """What ``torchkiln plugins`` shows about one registered plugin."""

    name: str
    builtin: bool
    hooks: tuple[str, ...]
    distribution: str | None = None
    version: str | None = None
    entry_point: str | None = None


@attrs.frozen
class FailedPlugin:
    """An external plugin that could not be loaded, and why."""

    entry_point: str
    value: str
    distribution: str | None
    version: str | None
    error: str

    def describe(self) -> str:
        dist = (
            f"{self.distribution} {self.version}" if self.distribution else "unknown distribution"
        )
        return (
            f"torchkiln plugin {self.entry_point!r} = {self.value!r} (from {dist}) failed to "
            f"load and was skipped: {self.error}"
        )


@attrs.frozen
class Declared(Generic[SpecT]):
    """A declared backend, selector or strategy, with the plugin that declared it."""

    spec: SpecT
    plugin: str


class PluginManager(pluggy.PluginManager):
    """A torchkiln plugin manager: pluggy's, with torchkiln's hook specs and loading rules.

    :param builtins: register the built-in plugins.
    :param entry_points: load external plugins from the ``torchkiln`` entry-point group (lazily,
        once, on first use); ``None`` follows ``TORCHKILN_DISABLE_PLUGIN_AUTOLOAD``.
    :param env: the environment to read the ``TORCHKILN_*`` plugin controls from.
    """

    def __init__(
        self,
        *,
        builtins: bool = True,
        entry_points: bool | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(hooks.PROJECT_NAME)
        self.add_hookspecs(hooks)
        self._env = dict(os.environ if env is None else env)
        self.strict = env_flag(self._env, "TORCHKILN_STRICT_PLUGINS")
        if entry_points is None:
            entry_points = not env_flag(self._env, "TORCHKILN_DISABLE_PLUGIN_AUTOLOAD")
        self._entry_points_pending = entry_points
        self.failed: list[FailedPlugin] = []
        self.external: dict[str, PluginInfo] = {}
        self._declared_cache: dict[str, dict[str, Any]] = {}
        for name in env_names(self._env, "TORCHKILN_DISABLED_PLUGINS") or ():
            self.set_blocked(name)
        if builtins:
            self._register_builtins()
        self.tracing = env_flag(self._env, "TORCHKILN_TRACE_PLUGINS")
        if self.tracing:
            self.add_hookcall_monitoring(_trace_before, _trace_after)

    # --- registration --------------------------------------------------------------------

    def _register_builtins(self) -> None:
        for module_name in BUILTIN_PLUGINS:
            name = builtin_name(module_name)
            if self.is_blocked(name):
                continue
            self.register(importlib.import_module(module_name), name=name)

    def register(self, plugin: object, name: str | None = None) -> str | None:
        self._declared_cache.clear()
        return super().register(plugin, name)

    def unregister(self, plugin: object | None = None, name: str | None = None) -> Any:
        self._declared_cache.clear()
        return super().unregister(plugin, name)

    def ensure_loaded(self) -> PluginManager:
        """Load entry-point plugins now if they are due (once per manager)."""
        if self._entry_points_pending:
            self._entry_points_pending = False
            self.load_external()
        return self

    def load_external(self) -> None:
        """Load every allowed plugin of the ``torchkiln`` entry-point group, each isolated."""
        only = env_names(self._env, "TORCHKILN_PLUGINS")
        seen: set[str] = set()
        for entry_point in metadata.entry_points(group=ENTRY_POINT_GROUP):
            if entry_point.name in seen or self.is_blocked(entry_point.name):
                continue
            seen.add(entry_point.name)
            if only is not None and entry_point.name not in only:
                continue
            if self.get_plugin(entry_point.name) is not None:
                continue
            self._load_entry_point(entry_point)
        self._declared_cache.clear()

    def _load_entry_point(self, entry_point: metadata.EntryPoint) -> None:
        dist = getattr(entry_point, "dist", None)
        dist_name = dist.metadata["Name"] if dist is not None else None
        version = dist.version if dist is not None else None
        try:
            plugin = entry_point.load()
            self.register(plugin, name=entry_point.name)
            self._check_plugin(entry_point.name, plugin)
        except Exception as error:  # isolate: one broken plugin never stops the others
            if self.get_plugin(entry_point.name) is not None:
                self.unregister(name=entry_point.name)
            failure = FailedPlugin(
                entry_point.name,
                entry_point.value,
                dist_name,
                version,
                f"{type(error).__name__}: {error}",
            )
            self.failed.append(failure)
            if self.strict:
                raise PluginError(
                    failure.describe().replace("was skipped", "was not loaded")
                    + " (TORCHKILN_STRICT_PLUGINS=1)"
                ) from error
            warnings.warn(failure.describe(), RuntimeWarning, stacklevel=3)
            return
        self.external[entry_point.name] = PluginInfo(
            entry_point.name,
            False,
            self._hook_names(plugin),
            dist_name,
            version,
            entry_point.value,
        )

    def _check_plugin(self, name: str, plugin: object) -> None:
        """Reject hook implementations for hooks torchkiln does not define (typos)."""
        known = self.hook_names()
        for hook_name in self._hook_names(plugin):
            if hook_name not in known:
                close = difflib.get_close_matches(hook_name, known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise PluginError(
                    f"plugin {name!r} implements unknown hook {hook_name!r}{hint}; torchkiln "
                    "hooks: " + ", ".join(known)
                )

    def hook_names(self) -> list[str]:
        """The hooks torchkiln specifies (not names a plugin implemented without a spec)."""
        return sorted(
            name
            for name, caller in vars(self.hook).items()
            if not name.startswith("_") and getattr(caller, "spec", None) is not None
        )

    def _hook_names(self, plugin: object) -> tuple[str, ...]:
        names = []
        for attr in dir(plugin):
            try:
                if self.parse_hookimpl_opts(plugin, attr) is not None:
                    names.append(attr)
            except Exception:
                continue
        return tuple(sorted(names))

    def plugin_infos(self) -> list[PluginInfo]:
        """Every registered plugin, built-ins first."""
        self.ensure_loaded()
        infos = []
        for name, plugin in self.list_name_plugin():
            if plugin is None:  # blocked (TORCHKILN_DISABLED_PLUGINS): pluggy keeps the name
                continue
            if name in self.external:
                infos.append(self.external[name])
            else:
                infos.append(
                    PluginInfo(name, name.startswith("torchkiln."), self._hook_names(plugin))
                )
        return sorted(infos, key=lambda info: (not info.builtin, info.name))

    def call_impl(self, hook_name: str, impl: Any, **kwargs: Any) -> Any:
        """Call one implementation directly (hooks whose results torchkiln combines per
        plugin), traced like ``pm.hook`` calls under ``TORCHKILN_TRACE_PLUGINS=1``."""
        if self.tracing:
            args = ", ".join(f"{k}={_short(v)}" for k, v in kwargs.items())
            print(
                f"torchkiln: hook {hook_name}({args}) -> plugin {impl.plugin_name}", file=sys.stderr
            )
        try:
            result = impl.function(**{name: kwargs[name] for name in impl.argnames})
        except Exception as error:
            if self.tracing:
                print(
                    f"torchkiln: hook {hook_name} [{impl.plugin_name}] raised {error!r}",
                    file=sys.stderr,
                )
            raise
        if self.tracing:
            print(
                f"torchkiln: hook {hook_name} [{impl.plugin_name}] returned {_short(result)}",
                file=sys.stderr,
            )
        return result

    # --- declarations ----------------------------------------------------------------------

    def _declared(self, hook_name: str, kind: str) -> dict[str, Declared[Any]]:
        self.ensure_loaded()
        if hook_name in self._declared_cache:
            return self._declared_cache[hook_name]
        result: dict[str, Declared[Any]] = {}
        hook = getattr(self.hook, hook_name)
        # pluggy calls the last registered (or tryfirst) implementation first: that one wins.
        for impl in reversed(hook.get_hookimpls()):
            try:
                specs = self.call_impl(hook_name, impl) or ()
            except Exception as error:
                raise PluginError(
                    f"plugin {impl.plugin_name!r} raised in {hook_name}(): "
                    f"{type(error).__name__}: {error}"
                ) from error
            for spec in specs:
                if spec.name in result:
                    warnings.warn(
                        f"{kind} {spec.name!r} is declared by both plugin "
                        f"{result[spec.name].plugin!r} and plugin {impl.plugin_name!r}; using "
                        f"{result[spec.name].plugin!r} (the one registered last, or tryfirst)",
                        RuntimeWarning,
                        stacklevel=3,
                    )
                    continue
                result[spec.name] = Declared(spec, impl.plugin_name)
        self._declared_cache[hook_name] = result
        return result

    def backends(self, *, include_torch: bool = True) -> dict[str, Declared[BackendSpec]]:
        """Backends declared by plugins, then every other name torch's registry knows."""
        declared = dict(self._declared("declare_backends", "backend"))
        if include_torch:
            for name in torch_backend_names():
                if name not in declared:
                    declared[name] = Declared(
                        BackendSpec(
                            name, description="registered with torch._dynamo", origin="torch"
                        ),
                        "torch",
                    )
        return declared

    def selectors(self) -> dict[str, Declared[SelectorSpec]]:
        return self._declared("declare_selectors", "selector")

    def distributed_strategies(self) -> dict[str, Declared[DistributedSpec]]:
        return self._declared("declare_distributed", "distributed strategy")


def _short(value: Any, limit: int = 200) -> str:
    text = " ".join(repr(value).split())  # one line per trace record, even for modules
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _trace_before(hook_name: str, impls: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    args = ", ".join(f"{k}={_short(v)}" for k, v in kwargs.items())
    plugins = ", ".join(impl.plugin_name for impl in reversed(impls))
    print(f"torchkiln: hook {hook_name}({args}) -> plugins [{plugins}]", file=sys.stderr)


def _trace_after(
    outcome: Any, hook_name: str, impls: Sequence[Any], kwargs: Mapping[str, Any]
) -> None:
    exception = outcome.exception
    shown = f"raised {exception!r}" if exception is not None else _short(outcome.get_result())
    print(f"torchkiln: hook {hook_name} returned {shown}", file=sys.stderr)


_default_manager: PluginManager | None = None


def get_plugin_manager() -> PluginManager:
    """The process-wide default plugin manager (created on first use)."""
    global _default_manager
    if _default_manager is None:
        _default_manager = PluginManager()
    return _default_manager


def reset_plugin_manager() -> None:
    """Forget the default manager (tests; after installing a plugin in-process)."""
    global _default_manager
    _default_manager = None
