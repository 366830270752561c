"""The plugin manager: built-in plugins, entry-point plugins, environment controls.

The manager holds the state (registered, installed and failed plugins, cached declarations);
the steps it takes are in :mod:`.entry_point_loading`, :mod:`.plugin_checks`,
:mod:`.declaration_collection`, :mod:`.name_serving` and :mod:`.plugin_listing`.

The environment controls (``TORCHKILN_DISABLE_PLUGIN_AUTOLOAD``, ``TORCHKILN_PLUGINS``,
``TORCHKILN_DISABLED_PLUGINS``, ``TORCHKILN_STRICT_PLUGINS``, ``TORCHKILN_TRACE_PLUGINS``),
the precedence of plugins (registered, then installed, then built-ins; the first called wins
a name declared twice) and the quarantine of a plugin whose ``declare_*`` hook fails are
documented in docs/plugins.md, where users read them.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from importlib import metadata
from typing import Any

import pluggy
from pluggy import HookImpl

from torchkiln.errors import PluginError
from torchkiln.plugin_host import hooks, name_serving, plugin_listing
from torchkiln.plugin_host.declaration_collection import collect_declarations, quarantine_record
from torchkiln.plugin_host.declarations import (
    BackendSpec,
    DistributedSpec,
    LayerCacheSpec,
    SelectorSpec,
)
from torchkiln.plugin_host.entry_point_loading import (
    ENTRY_POINT_GROUP as ENTRY_POINT_GROUP,  # re-exported: its home before entry_point_loading
)
from torchkiln.plugin_host.entry_point_loading import (
    entry_points_to_load,
    installed_plugin_names,
    load_failure,
    loaded_plugin_info,
    strict_load_error,
)
from torchkiln.plugin_host.name_serving import serve, unserved_reason
from torchkiln.plugin_host.plugin_checks import check_plugin, implemented_hooks, specified_hooks
from torchkiln.plugin_host.plugin_env import (
    call_traced,
    env_flag,
    env_names,
    trace_after,
    trace_before,
    warn_unknown_names,
)
from torchkiln.plugin_host.plugin_info import (
    DeclarationFailed,
    Declared,
    FailedPlugin,
    PluginInfo,
    builtin_name,
    readable_name,
)
from torchkiln.plugin_host.plugin_listing import registered_plugins, with_torch_backends
from torchkiln.plugin_host.torch_backends import compile_with_torch
from torchkiln.plugins import BUILTIN_PLUGINS

_BUILTIN_NAMES = frozenset(builtin_name(m) for m in BUILTIN_PLUGINS)


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

        self.disabled = {
            n.lower() for n in env_names(self._env, "TORCHKILN_DISABLED_PLUGINS") or ()
        }
        """``TORCHKILN_DISABLED_PLUGINS``, lower case."""
        for name in env_names(self._env, "TORCHKILN_DISABLED_PLUGINS") or ():
            self.set_blocked(name)  # as spelled; other spellings are blocked when met
        self._registering_internally = False
        self._names_checked = False
        if builtins:
            self._register_builtins()
        self.tracing = env_flag(self._env, "TORCHKILN_TRACE_PLUGINS")
        if self.tracing:
            self.add_hookcall_monitoring(trace_before, trace_after)

    # --- registration --------------------------------------------------------------------

    def _register_builtins(self) -> None:
        for module_name in BUILTIN_PLUGINS:
            name = builtin_name(module_name)
            if name.lower() in self.disabled:
                self.set_blocked(name)
                continue
            with self._registering_itself():
                self.register(importlib.import_module(module_name), name=name)

    @contextlib.contextmanager
    def _registering_itself(self) -> Iterator[None]:
        """The manager registering built-ins or entry points: :meth:`register` must not load
        the entry points first (they are not due yet, or are what is being loaded)."""
        self._registering_internally = True
        try:
            yield
        finally:
            self._registering_internally = False

    def register(self, plugin: object, name: str | None = None) -> str | None:
        """Register ``plugin`` (a module or an object with ``@hookimpl`` methods).

        :param name: defaults to :func:`readable_name` (``mypkg.plugin``, ``mypkg.MyPlugin``),
            with ``#2``, ``#3``... appended when that name is taken.
        :return: the registered name (``None`` when the name is blocked).
        :raises PluginError: the plugin implements a hook torchkiln does not define (or, with
            ``TORCHKILN_STRICT_PLUGINS=1``, declares names without implementing the hook that
            serves them; otherwise that is a ``RuntimeWarning`` naming the plugin).
        """
        if not self._registering_internally:
            self.ensure_loaded()  # entry points always come before explicit registrations
        if name is None:
            name = self._free_name(readable_name(plugin))
        check_plugin(self, name, plugin, strict=self.strict)
        self._declared_cache.clear()
        return super().register(plugin, name)

    def _free_name(self, base: str) -> str:
        name, number = base, 1
        while self.has_plugin(name):
            number += 1
            name = f"{base}#{number}"
        return name

    def unregister(self, plugin: object | None = None, name: str | None = None) -> Any:
        self._declared_cache.clear()
        return super().unregister(plugin, name)

    def ensure_loaded(self) -> PluginManager:
        """Load entry-point plugins now if they are due (once per manager)."""
        if self._entry_points_pending:
            self._entry_points_pending = False
            self.check_plugin_controls()
            self.load_external()
        return self

    def load_external(self) -> None:
        """Load every allowed plugin of the ``torchkiln`` entry-point group, each isolated."""
        allowed, blocked = entry_points_to_load(self._env, self.disabled)
        for name in blocked:
            self.set_blocked(name)
        for entry_point in allowed:
            if self.get_plugin(entry_point.name) is not None:
                continue
            if any(f.name == entry_point.name and f.hook for f in self.failed):
                continue  # quarantined: stays out when the entry points are loaded again
            with self._registering_itself():
                self._load_entry_point(entry_point)
        self._declared_cache.clear()

    def check_plugin_controls(self) -> None:
        """Warn (once) about names in ``TORCHKILN_PLUGINS`` / ``TORCHKILN_DISABLED_PLUGINS``
        that match no built-in and no installed entry point, with the closest known name."""
        if self._names_checked:
            return
        self._names_checked = True
        builtins = [builtin_name(m) for m in BUILTIN_PLUGINS]
        warn_unknown_names(self._env, installed_plugin_names(), builtins)

    def _load_entry_point(self, entry_point: metadata.EntryPoint) -> None:
        try:
            plugin = entry_point.load()
            self.register(plugin, name=entry_point.name)  # checks it (check_plugin), once
        except Exception as error:  # isolate: one broken plugin never stops the others
            if self.get_plugin(entry_point.name) is not None:
                self.unregister(name=entry_point.name)
            failure = load_failure(entry_point, error)
            self.failed.append(failure)
            if self.strict:
                raise strict_load_error(failure, error) from error
            warnings.warn(failure.describe(), RuntimeWarning, stacklevel=3)
            return
        hooks_implemented = implemented_hooks(self, plugin)
        self.external[entry_point.name] = loaded_plugin_info(entry_point, hooks_implemented)

    def hook_names(self) -> list[str]:
        """The hooks torchkiln specifies (not names a plugin implemented without a spec)."""
        return specified_hooks(self)

    def plugin_infos(self) -> list[PluginInfo]:
        """Every registered plugin, built-ins first."""
        self.ensure_loaded()
        return registered_plugins(self, self.external, _BUILTIN_NAMES)

    def call_impl(self, hook_name: str, impl: Any, **kwargs: Any) -> Any:
        """Call one implementation directly (hooks whose results torchkiln combines per
        plugin), traced like ``pm.hook`` calls under ``TORCHKILN_TRACE_PLUGINS=1``."""
        if self.tracing:
            return call_traced(hook_name, impl, kwargs)
        return impl.function(**{name: kwargs[name] for name in impl.argnames})

    # --- dispatch: only the declaring plugin serves a name -----------------------------------

    def implementation(self, hook_name: str, plugin_name: str) -> HookImpl | None:
        """``plugin_name``'s implementation of ``hook_name``, if it has one."""
        return name_serving.implementation(self, hook_name, plugin_name)

    def select_regions(self, model: Any, config: Any, selector: str) -> Any:
        """The plan the plugin that declared ``selector`` makes (its ``select_regions`` only)."""
        declared = self.selectors().get(selector)
        if declared is None:
            raise PluginError(
                f"no plugin declares the selector {selector!r}{self.missing_hint()}",
                hook="select_regions",
            )
        return serve(
            self,
            "select_regions",
            declared,
            "selector",
            model=model,
            config=config,
            selector=selector,
        )

    def wrap_distributed(
        self,
        model: Any,
        config: Any,
        plan: Any,
        strategy: str,
        compile_regions: Callable[[Any], None],
    ) -> Any:
        """The declaring plugin's ``wrap_distributed`` for ``strategy``."""
        declared = self.distributed_strategies().get(strategy)
        if declared is None:
            raise PluginError(
                f"no plugin declares the distributed strategy {strategy!r}{self.missing_hint()}",
                hook="wrap_distributed",
            )
        return serve(
            self,
            "wrap_distributed",
            declared,
            "distributed strategy",
            model=model,
            config=config,
            plan=plan,
            strategy=strategy,
            compile_regions=compile_regions,
        )

    def compile_region(self, fn: Any, group: Any, config: Any, backend: str) -> Any:
        """The declaring plugin's ``compile_region`` for ``backend``; for a name only torch
        knows, ``torch.compile`` with the configured options."""
        declared = self.backend(backend)
        if declared is None:
            raise PluginError(
                f"no plugin declares the backend {backend!r}{self.missing_hint()}",
                hook="compile_region",
            )
        if declared.spec.origin == "torch":
            return compile_with_torch(fn, config, backend)
        if declared.spec.compile is not None:  # the backend carries its compile
            compiled = declared.spec.compile(fn, group, config)
            if compiled is None:
                raise PluginError(
                    f"plugin {declared.plugin!r} declares backend {backend!r} but its "
                    "BackendSpec.compile returned None",
                    plugin=declared.plugin,
                    hook="compile_region",
                )
            return compiled
        return serve(
            self,
            "compile_region",
            declared,
            "backend",
            fn=fn,
            group=group,
            config=config,
            backend=backend,
        )

    def missing_hint(self) -> str:
        """``" (disabled ...; failed to load ...)"``: why a name might be missing, or ``""``."""
        return plugin_listing.missing_hint(self, self.failed)

    # --- declarations ----------------------------------------------------------------------

    def _declared(self, hook_name: str, kind: str) -> dict[str, Declared[Any]]:
        self.ensure_loaded()
        if hook_name in self._declared_cache:
            return self._declared_cache[hook_name]
        while True:
            try:
                result, twice = collect_declarations(self, hook_name, kind, self.call_impl)
            except DeclarationFailed as error:
                self._quarantine(error)  # raises under TORCHKILN_STRICT_PLUGINS=1
                continue  # the plugin at fault is gone: ask the others again
            break
        for message in twice:
            warnings.warn(message, RuntimeWarning, stacklevel=3)
        self._declared_cache[hook_name] = result
        return result

    def unserved(self, declared: Declared[Any]) -> str | None:
        """Why ``declared`` cannot be used although it is declared: its plugin does not
        implement the hook that serves it; ``None`` when it does."""
        return unserved_reason(self, declared)

    def _quarantine(self, error: DeclarationFailed) -> None:
        """Unregister the plugin a declaration hook failed in, and record why; under
        ``TORCHKILN_STRICT_PLUGINS=1`` raise instead."""
        name, hook_name = error.plugin, error.hook
        assert name is not None and hook_name is not None
        if self.strict:
            raise PluginError(
                f"{error} (TORCHKILN_STRICT_PLUGINS=1)", plugin=name, hook=hook_name
            ) from error
        failure = quarantine_record(name, hook_name, error, self.external.pop(name, None))
        self.unregister(name=name)
        self.failed.append(failure)
        warnings.warn(failure.describe(), RuntimeWarning, stacklevel=4)

    def backends(self, *, include_torch: bool = True) -> dict[str, Declared[BackendSpec]]:
        """Backends declared by plugins, then every other name torch's registry knows."""
        declared = self._declared("declare_backends", "backend")
        return with_torch_backends(declared) if include_torch else dict(declared)

    def backend(self, name: str) -> Declared[BackendSpec] | None:
        """The backend ``name`` as :meth:`backends` gives it, without listing torch's
        registry when a plugin declares the name (listing it imports every Dynamo backend
        module and scans the entry points: a cost ``torchkiln.compile`` need not pay)."""
        declared = self._declared("declare_backends", "backend").get(name)
        if declared is not None:
            return declared
        return self.backends().get(name)

    def selectors(self) -> dict[str, Declared[SelectorSpec]]:
        return self._declared("declare_selectors", "selector")

    def distributed_strategies(self) -> dict[str, Declared[DistributedSpec]]:
        return self._declared("declare_distributed", "distributed strategy")

    def layer_caches(self) -> tuple[LayerCacheSpec, ...]:
        """Every plugin's per-layer cache declarations, the plugin called first first."""
        declared = self._declared("declare_layer_caches", "layer cache")
        return tuple(entry.spec for entry in declared.values())
