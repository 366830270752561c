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

Names in both lists are matched case-insensitively (``TorchKiln.TensorRT`` blocks
``torchkiln.tensorrt``). A name that matches no built-in and no installed entry point is
reported with a ``RuntimeWarning`` (with the closest known name) when plugins load.

Precedence does not depend on when plugins are registered, nor on the order Python finds
installed distributions: plugins registered with :meth:`PluginManager.register` first (the
last registered first of all), then installed (entry-point) plugins in the order
``TORCHKILN_PLUGINS`` names them, else by entry-point name (case-insensitively, ``a`` before
``b``), then the built-ins. The first in that order is called first, and its declarations win a
name declared twice; ``tryfirst`` / ``trylast`` on a ``hookimpl`` move it within that order.
(``register`` loads the entry points first if they are due, so a framework that registers its
plugin before the first compile gets the same order as one that registers after.)

A plugin whose ``declare_*`` hook raises or returns something else than a list of its spec
type is quarantined: unregistered, listed in :attr:`PluginManager.failed` (``torchkiln
plugins`` shows it as FAILED with the reason), its names unknown with that reason, and every
other plugin unaffected. A plugin that declares a name without the hook that serves it
(``compile_region``, ``select_regions``, ``wrap_distributed``) does not provide that name:
using it is refused when the configuration is validated, like an unknown name.
``TORCHKILN_STRICT_PLUGINS=1``
    a plugin that fails to import, to validate or to declare raises
    :class:`~torchkiln.PluginError` instead of being skipped (or quarantined) with a warning.
``TORCHKILN_TRACE_PLUGINS=1``
    print each hook call, its arguments and its result to stderr.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping
from importlib import metadata
from typing import Any

import pluggy
from pluggy import HookImpl

from torchkiln.errors import PluginError
from torchkiln.plugin_host import hooks
from torchkiln.plugin_host.declarations import (
    BackendSpec,
    DistributedSpec,
    LayerCacheSpec,
    SelectorSpec,
)
from torchkiln.plugin_host.plugin_env import (
    env_flag,
    env_names,
    short,
    trace_after,
    trace_before,
    warn_unknown_names,
)
from torchkiln.plugin_host.plugin_info import (
    DECLARATION_KINDS,
    DECLARING_HOOK,
    IMPLEMENTING_HOOK,
    SERVING_HOOK,
    DeclarationFailed,
    Declared,
    FailedPlugin,
    PluginInfo,
    builtin_name,
    check_specs,
    readable_name,
)
from torchkiln.plugin_host.torch_backends import compile_with_torch, torch_backend_names
from torchkiln.plugins import BUILTIN_PLUGINS

ENTRY_POINT_GROUP = "torchkiln"

_BUILTIN_NAMES = frozenset("torchkiln." + m.rsplit(".", 1)[-1] for m in BUILTIN_PLUGINS)


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
            self._register_internally(importlib.import_module(module_name), name)

    def _register_internally(self, plugin: object, name: str) -> None:
        self._registering_internally = True
        try:
            self.register(plugin, name=name)
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
        self._check_plugin(name, plugin)
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
        only = {n.lower() for n in env_names(self._env, "TORCHKILN_PLUGINS") or ()} or None
        seen: set[str] = set()
        for entry_point in self._load_order(metadata.entry_points(group=ENTRY_POINT_GROUP)):
            if entry_point.name in seen:
                continue
            seen.add(entry_point.name)
            if entry_point.name.lower() in self.disabled:
                self.set_blocked(entry_point.name)
                continue
            if only is not None and entry_point.name.lower() not in only:
                continue
            if self.get_plugin(entry_point.name) is not None:
                continue
            if any(f.name == entry_point.name and f.hook for f in self.failed):
                continue  # quarantined: stays out when the entry points are loaded again
            self._registering_internally = True
            try:
                self._load_entry_point(entry_point)
            finally:
                self._registering_internally = False
        self._declared_cache.clear()

    def _load_order(self, entry_points: Iterable[metadata.EntryPoint]) -> list[metadata.EntryPoint]:
        """Registration order: the plugin registered last is called first and wins a name, so
        the one that must win (first in ``TORCHKILN_PLUGINS``, else the first by name) is
        registered last. The order Python finds distributions in never matters."""
        listed = [n.strip().lower() for n in self._env.get("TORCHKILN_PLUGINS", "").split(",")]
        rank = {name: index for index, name in reversed(list(enumerate(listed))) if name}

        def precedence(entry_point: metadata.EntryPoint) -> tuple[int, str, str]:
            name = entry_point.name.lower()
            return (rank.get(name, len(rank)), name, entry_point.value)

        return sorted(entry_points, key=precedence, reverse=True)

    def check_plugin_controls(self) -> None:
        """Warn (once) about names in ``TORCHKILN_PLUGINS`` / ``TORCHKILN_DISABLED_PLUGINS``
        that match no built-in and no installed entry point, with the closest known name."""
        if self._names_checked:
            return
        self._names_checked = True
        external = sorted({ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)})
        builtins = [builtin_name(m) for m in BUILTIN_PLUGINS]
        warn_unknown_names(self._env, external, builtins)

    def _load_entry_point(self, entry_point: metadata.EntryPoint) -> None:
        dist = getattr(entry_point, "dist", None)
        dist_name = dist.metadata["Name"] if dist is not None else None
        version = dist.version if dist is not None else None
        try:
            plugin = entry_point.load()
            self.register(plugin, name=entry_point.name)  # checks it (_check_plugin), once
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
                    + " (TORCHKILN_STRICT_PLUGINS=1)",
                    plugin=entry_point.name,
                    hook=getattr(error, "hook", None),
                ) from error
            warnings.warn(failure.describe(), RuntimeWarning, stacklevel=3)
            return
        self.external[entry_point.name] = PluginInfo(
            entry_point.name,
            "entry-point",
            self._hook_names(plugin),
            dist_name,
            version,
            entry_point.value,
        )

    def _check_plugin(self, name: str, plugin: object) -> None:
        """Reject hook implementations for hooks torchkiln does not define (typos), and
        declarations without the hook that serves them."""
        known = self.hook_names()
        implemented = self._hook_names(plugin)
        for hook_name in implemented:
            if hook_name not in known:
                close = difflib.get_close_matches(hook_name, known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise PluginError(
                    f"plugin {name!r} implements unknown hook {hook_name!r}{hint}; torchkiln "
                    "hooks: " + ", ".join(known),
                    plugin=name,
                    hook=hook_name,
                )
        for declaration, serving in IMPLEMENTING_HOOK.items():
            if declaration in implemented and serving not in implemented:
                message = (
                    f"plugin {name!r} implements {declaration} but not {serving}: the names it "
                    f"declares are refused when a configuration uses them; add a @hookimpl "
                    f"{serving}"
                )
                if self.strict:
                    raise PluginError(
                        message + " (TORCHKILN_STRICT_PLUGINS=1)", plugin=name, hook=serving
                    )
                warnings.warn(message, RuntimeWarning, stacklevel=4)

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
                kind = "builtin" if name in _BUILTIN_NAMES else "registered"
                infos.append(PluginInfo(name, kind, self._hook_names(plugin)))
        order = {"builtin": 0, "entry-point": 1, "registered": 2}
        return sorted(infos, key=lambda info: (order[info.kind], info.name))

    def call_impl(self, hook_name: str, impl: Any, **kwargs: Any) -> Any:
        """Call one implementation directly (hooks whose results torchkiln combines per
        plugin), traced like ``pm.hook`` calls under ``TORCHKILN_TRACE_PLUGINS=1``."""
        if self.tracing:
            args = ", ".join(f"{k}={short(v)}" for k, v in kwargs.items())
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
                f"torchkiln: hook {hook_name} [{impl.plugin_name}] returned {short(result)}",
                file=sys.stderr,
            )
        return result

    # --- dispatch: only the declaring plugin serves a name -----------------------------------

    def implementation(self, hook_name: str, plugin_name: str) -> HookImpl | None:
        """``plugin_name``'s implementation of ``hook_name``, if it has one."""
        hook = getattr(self.hook, hook_name)
        return next((i for i in hook.get_hookimpls() if i.plugin_name == plugin_name), None)

    def _serve(self, hook_name: str, declared: Declared[Any], kind: str, **kwargs: Any) -> Any:
        impl = self.implementation(hook_name, declared.plugin)
        if impl is None:  # unregistered since it declared (declarations are cached)
            raise PluginError(
                f"plugin {declared.plugin!r} declares {kind} {declared.spec.name!r} but does "
                f"not implement {hook_name}",
                plugin=declared.plugin,
                hook=hook_name,
            )
        # A pluggy subset caller, so pluggy's tracing and TORCHKILN_TRACE_PLUGINS see the call.
        others = [
            p for name, p in self.list_name_plugin() if p is not None and name != impl.plugin_name
        ]
        results = self.subset_hook_caller(hook_name, remove_plugins=others)(**kwargs)
        result = results[0] if results else None
        if result is None:
            raise PluginError(
                f"plugin {declared.plugin!r} declares {kind} {declared.spec.name!r} but its "
                f"{hook_name} returned None for it",
                plugin=declared.plugin,
                hook=hook_name,
            )
        return result

    def select_regions(self, model: Any, config: Any, selector: str) -> Any:
        """The plan the plugin that declared ``selector`` makes (its ``select_regions`` only)."""
        declared = self.selectors().get(selector)
        if declared is None:
            raise PluginError(
                f"no plugin declares the selector {selector!r}{self.missing_hint()}",
                hook="select_regions",
            )
        return self._serve(
            "select_regions", declared, "selector", model=model, config=config, selector=selector
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
        return self._serve(
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
        return self._serve(
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

    def _declared(self, hook_name: str, kind: str) -> dict[str, Declared[Any]]:
        self.ensure_loaded()
        if hook_name in self._declared_cache:
            return self._declared_cache[hook_name]
        while True:
            try:
                result, twice = self._collect(hook_name, kind)
            except DeclarationFailed as error:
                self._quarantine(error)  # raises under TORCHKILN_STRICT_PLUGINS=1
                continue  # the culprit is gone: ask the others again
            break
        for message in twice:
            warnings.warn(message, RuntimeWarning, stacklevel=3)
        self._declared_cache[hook_name] = result
        return result

    def _collect(self, hook_name: str, kind: str) -> tuple[dict[str, Declared[Any]], list[str]]:
        """Every plugin's declarations, the first called winning a name; and the warnings
        about names declared twice. :raises PluginError: naming the plugin whose hook failed."""
        result: dict[str, Declared[Any]] = {}
        twice: list[str] = []
        hook = getattr(self.hook, hook_name)
        # pluggy calls the last registered (or tryfirst) implementation first: that one wins.
        for impl in reversed(hook.get_hookimpls()):
            try:
                specs = self.call_impl(hook_name, impl) or ()
            except Exception as error:
                detail = f"raised {type(error).__name__}: {error}"
                raise DeclarationFailed(impl.plugin_name, hook_name, detail) from error
            check_specs(hook_name, impl.plugin_name, specs)
            for spec in specs:
                if spec.name in result:
                    twice.append(
                        f"{kind} {spec.name!r} is declared by both plugin "
                        f"{result[spec.name].plugin!r} and plugin {impl.plugin_name!r}; using "
                        f"{result[spec.name].plugin!r} (the first in precedence order: "
                        "registered last, or tryfirst; docs/plugins/packaging.md)"
                    )
                else:
                    result[spec.name] = Declared(spec, impl.plugin_name)
        return result, twice

    def unserved(self, declared: Declared[Any]) -> str | None:
        """Why ``declared`` cannot be used although it is declared: its plugin does not
        implement the hook that serves it; ``None`` when it does."""
        if getattr(declared.spec, "origin", "plugin") == "torch":
            return None
        hook_name = SERVING_HOOK[type(declared.spec)]
        if self.implementation(hook_name, declared.plugin) is not None:
            return None
        kind = DECLARATION_KINDS[DECLARING_HOOK[type(declared.spec)]]
        return (
            f"plugin {declared.plugin!r} declares {kind} {declared.spec.name!r} but does not "
            f"implement {hook_name}, so the name cannot be used"
        )

    def _quarantine(self, error: DeclarationFailed) -> None:
        """Unregister the plugin a declaration hook failed in, and record why; under
        ``TORCHKILN_STRICT_PLUGINS=1`` raise instead."""
        name, hook_name = error.plugin, error.hook
        assert name is not None and hook_name is not None
        if self.strict:
            raise PluginError(
                f"{error} (TORCHKILN_STRICT_PLUGINS=1)", plugin=name, hook=hook_name
            ) from error
        info = self.external.pop(name, None)
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
