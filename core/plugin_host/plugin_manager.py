"""The plugin manager: built-in and entry-point plugins, what they declare, and serving a
declared name by the plugin that declared it. Loading and the checks at registration are in
:mod:`.plugin_loading`. docs/plugins.md documents the controls
(``TORCHKILN_DISABLE_PLUGIN_AUTOLOAD``, ``TORCHKILN_PLUGINS``, ``TORCHKILN_DISABLED_PLUGINS``,
``TORCHKILN_STRICT_PLUGINS``, ``TORCHKILN_TRACE_PLUGINS``), the precedence of plugins and the
quarantine of a plugin whose ``declare_*`` hook fails.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from importlib import metadata
from typing import Any

import pluggy

from torchkiln.errors import PluginError
from torchkiln.plugin_host import hooks
from torchkiln.plugin_host.backend_compile import backend_implementation
from torchkiln.plugin_host.declarations import (
    BackendSpec,
    DistributedSpec,
    LayerCacheSpec,
    SelectorSpec,
)
from torchkiln.plugin_host.hook_calls import (
    call_implementation,
    plain_implementation,
    plain_implementations,
)
from torchkiln.plugin_host.plugin_faults import plugin_at_fault
from torchkiln.plugin_host.plugin_info import (
    DECLARATIONS,
    DeclarationFailed,
    Declared,
    FailedPlugin,
    PluginInfo,
    builtin_name,
    check_specs,
    declaration_of,
    readable_name,
)
from torchkiln.plugin_host.plugin_loading import (
    distribution_of,
    entry_points_to_load,
    env_flag,
    env_names,
    installed_plugin_names,
    trace_after,
    trace_before,
    warn_unknown_names,
)
from torchkiln.plugin_host.registration_checks import (
    check_plugin,
    implemented_hooks,
    refused_by_pluggy,
)
from torchkiln.plugin_host.torch_backends import torch_backend_names
from torchkiln.plugins import BUILTIN_PLUGINS

_BUILTIN_NAMES = frozenset(builtin_name(m) for m in BUILTIN_PLUGINS)
_KIND_ORDER = {"builtin": 0, "entry-point": 1, "registered": 2}


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

        disabled = env_names(self._env, "TORCHKILN_DISABLED_PLUGINS")
        self.disabled = {name.lower() for name in disabled}
        """``TORCHKILN_DISABLED_PLUGINS``, lower case."""
        for name in disabled:
            self.set_blocked(name)  # as spelled; other spellings are blocked when met
        self._registering_internally = False
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
        try:
            return super().register(plugin, name)
        except pluggy.PluginValidationError as error:
            raise refused_by_pluggy(name, error) from error

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
            builtins = [builtin_name(m) for m in BUILTIN_PLUGINS]
            warn_unknown_names(self._env, installed_plugin_names(), builtins)
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

    def _load_entry_point(self, entry_point: metadata.EntryPoint) -> None:
        name, target = entry_point.name, entry_point.value
        try:
            plugin = entry_point.load()
            self.register(plugin, name=name)  # checks it (check_plugin), once
        except Exception as error:  # isolate: one broken plugin never stops the others
            if self.get_plugin(name) is not None:
                self.unregister(name=name)
            reason = f"{type(error).__name__}: {error}"
            failure = FailedPlugin(name, target, *distribution_of(entry_point), reason)
            self.failed.append(failure)
            if self.strict:
                message = failure.describe().replace("was skipped", "was not loaded")
                raise PluginError(
                    f"{message} (TORCHKILN_STRICT_PLUGINS=1)",
                    plugin=name,
                    hook=getattr(error, "hook", None),
                ) from error
            warnings.warn(failure.describe(), RuntimeWarning, stacklevel=3)
            return
        hooks_implemented = implemented_hooks(self, plugin)
        distribution, version = distribution_of(entry_point)
        self.external[name] = PluginInfo(
            name, "entry-point", hooks_implemented, distribution, version, target
        )

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
                kind = "builtin" if name in _BUILTIN_NAMES else "registered"
                infos.append(PluginInfo(name, kind, implemented_hooks(self, plugin)))
        return sorted(infos, key=lambda info: (_KIND_ORDER[info.kind], info.name))

    # --- dispatch: only the declaring plugin serves a name -----------------------------------

    def select_regions(self, model: Any, config: Any, selector: str) -> Any:
        """The plan the plugin that declared ``selector`` makes (its ``select_regions`` only)."""
        declared = self._declaring("select_regions", self.selectors().get(selector), selector)
        return self._serve(
            "select_regions", declared, model=model, config=config, selector=selector
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
        found = self.distributed_strategies().get(strategy)
        declared = self._declaring("wrap_distributed", found, strategy)
        return self._serve(
            "wrap_distributed",
            declared,
            model=model,
            config=config,
            plan=plan,
            strategy=strategy,
            compile_regions=compile_regions,
        )

    def compile_region(self, fn: Any, group: Any, config: Any, backend: str) -> Any:
        """``backend``'s compile of one group, through the ``compile_region`` hook: the
        backend's own compile (``BackendSpec.compile``; ``torch.compile`` for a name only torch
        knows), else the declaring plugin's ``compile_region``; inside every wrapper either way.
        """
        declared = self._declaring("compile_region", self.backend(backend), backend)
        kwargs = dict(fn=fn, group=group, config=config, backend=backend)
        if declared.spec.origin != "torch" and declared.spec.compile is None:
            return self._serve("compile_region", declared, **kwargs)  # a v1/v2 backend plugin
        compiled = call_implementation(
            self, "compile_region", backend_implementation(declared), **kwargs
        )
        if compiled is None:
            raise PluginError(
                f"plugin {declared.plugin!r} declares backend {backend!r} but its "
                "BackendSpec.compile returned None",
                plugin=declared.plugin,
                hook="compile_region",
            )
        return compiled

    def _declaring(self, hook_name: str, declared: Declared[Any] | None, name: str) -> Any:
        """``declared``; when no plugin declares ``name``, a :class:`PluginError` for the
        ``hook_name`` call that needed it."""
        if declared is None:
            kind = next(d.kind for d in DECLARATIONS.values() if d.serving_hook == hook_name)
            raise PluginError(
                f"no plugin declares the {kind} {name!r}{self.missing_hint()}", hook=hook_name
            )
        return declared

    def _serve(self, hook_name: str, declared: Declared[Any], **kwargs: Any) -> Any:
        """Call ``hook_name`` of the plugin that declared ``declared`` only (its plain
        implementation, inside every wrapper of the hook).

        :raises PluginError: that plugin no longer implements the hook, or returned ``None``.
        """
        what = f"plugin {declared.plugin!r} declares {declaration_of(declared.spec).kind} "
        what += repr(declared.spec.name)
        impl = plain_implementation(self, hook_name, declared.plugin)
        if impl is None:  # unregistered since, or it only wraps the hook
            raise PluginError(
                f"{what} but does not implement {hook_name}",
                plugin=declared.plugin,
                hook=hook_name,
            )
        result = call_implementation(self, hook_name, impl, **kwargs)
        if result is None:
            raise PluginError(
                f"{what} but its {hook_name} returned None for it",
                plugin=declared.plugin,
                hook=hook_name,
            )
        return result

    def unserved(self, declared: Declared[Any]) -> str | None:
        """Why ``declared`` cannot be used although it is declared: its plugin does not
        implement the hook that serves it; ``None`` when it does."""
        spec = declared.spec
        if isinstance(spec, BackendSpec) and (spec.origin == "torch" or spec.compile is not None):
            return None  # torch compiles it, or the backend carries its compile
        kind, _, hook_name = declaration_of(spec)
        if hook_name is None or plain_implementation(self, hook_name, declared.plugin):
            return None
        return (
            f"plugin {declared.plugin!r} declares {kind} {declared.spec.name!r} but does not "
            f"implement {hook_name}, so the name cannot be used"
        )

    def missing_hint(self) -> str:
        """``" (disabled ...; failed to load ...)"``: why a name might be missing, or ``""``."""
        parts = []
        blocked = sorted(name for name, plugin in self.list_name_plugin() if plugin is None)
        if blocked:
            parts.append("plugins disabled by TORCHKILN_DISABLED_PLUGINS: " + ", ".join(blocked))
        not_loaded = sorted(f.name for f in self.failed if f.hook is None)
        if not_loaded:
            parts.append("plugins that failed to load: " + ", ".join(not_loaded))
        quarantined = sorted(
            f"plugin {f.name!r} (its {f.reason})" for f in self.failed if f.hook is not None
        )
        if quarantined:
            parts.append("plugins quarantined, their names unavailable: " + ", ".join(quarantined))
        return f" ({'; '.join(parts)})" if parts else ""

    # --- declarations ----------------------------------------------------------------------

    def _declared(self, hook_name: str) -> dict[str, Declared[Any]]:
        """Every plugin's declarations, the plugin called first winning a name declared twice
        (with a warning naming both); a plugin whose hook fails is quarantined and the others
        are asked again."""
        self.ensure_loaded()
        if hook_name in self._declared_cache:
            return self._declared_cache[hook_name]
        while True:  # until no declaration fails: the plugin at fault is gone, ask the others
            try:
                result, twice = self._collect(hook_name)
                break
            except DeclarationFailed as error:
                self._quarantine(error)  # raises under TORCHKILN_STRICT_PLUGINS=1
        for message in twice:
            warnings.warn(message, RuntimeWarning, stacklevel=3)
        self._declared_cache[hook_name] = result
        return result

    def _collect(self, hook_name: str) -> tuple[dict[str, Declared[Any]], list[str]]:
        result: dict[str, Declared[Any]] = {}
        twice: list[str] = []
        # pluggy calls the last registered (or tryfirst) implementation first: that one wins.
        for impl in plain_implementations(self, hook_name):
            try:
                specs: Sequence[Any] = call_implementation(self, hook_name, impl) or ()
            except Exception as error:  # the wrapper it was raised in, if not the declaration
                at_fault = plugin_at_fault(self, hook_name, error) or impl.plugin_name
                detail = f"raised {type(error).__name__}: {error}"
                raise DeclarationFailed(at_fault, hook_name, detail) from error
            check_specs(hook_name, impl.plugin_name, specs)
            for spec in specs:
                if spec.name not in result:
                    result[spec.name] = Declared(spec, impl.plugin_name)
                    continue
                winner = result[spec.name].plugin
                twice.append(
                    f"{DECLARATIONS[hook_name].kind} {spec.name!r} is declared by both plugin "
                    f"{winner!r} and plugin {impl.plugin_name!r}; using {winner!r} (the first in "
                    "precedence order: registered last, or tryfirst; docs/plugins/packaging.md)"
                )
        return result, twice

    def _quarantine(self, error: DeclarationFailed) -> None:
        """Unregister the plugin a declaration hook failed in, and record why; under
        ``TORCHKILN_STRICT_PLUGINS=1`` raise instead."""
        name, hook_name = error.plugin, error.hook
        assert name is not None and hook_name is not None
        if self.strict:
            raise PluginError(
                f"{error} (TORCHKILN_STRICT_PLUGINS=1)", plugin=name, hook=hook_name
            ) from error
        info = self.external.pop(name, None)  # what is known of it when it is installed
        failure = FailedPlugin(
            name,
            info.target if info else None,
            info.distribution if info else None,
            info.version if info else None,
            error.detail,
            hook=hook_name,
        )
        self.unregister(name=name)
        self.failed.append(failure)
        warnings.warn(failure.describe(), RuntimeWarning, stacklevel=4)

    def backends(self, *, include_torch: bool = True) -> dict[str, Declared[BackendSpec]]:
        """Backends declared by plugins, then every other name torch's registry knows."""
        backends = dict(self._declared("declare_backends"))
        if include_torch:
            for name in torch_backend_names():
                if name not in backends:
                    description = "registered with torch._dynamo"
                    spec = BackendSpec(name, description=description, origin="torch")
                    backends[name] = Declared(spec, "torch")
        return backends

    def backend(self, name: str) -> Declared[BackendSpec] | None:
        """The backend ``name`` as :meth:`backends` gives it, without listing torch's
        registry when a plugin declares the name (listing it imports every Dynamo backend
        module and scans the entry points: a cost ``torchkiln.compile`` need not pay)."""
        declared = self._declared("declare_backends").get(name)
        if declared is not None:
            return declared
        return self.backends().get(name)

    def selectors(self) -> dict[str, Declared[SelectorSpec]]:
        return self._declared("declare_selectors")

    def distributed_strategies(self) -> dict[str, Declared[DistributedSpec]]:
        return self._declared("declare_distributed")

    def layer_caches(self) -> tuple[LayerCacheSpec, ...]:
        """Every plugin's per-layer cache declarations, the plugin called first first."""
        return tuple(entry.spec for entry in self._declared("declare_layer_caches").values())
