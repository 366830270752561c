"""The checks a plugin passes when it is registered (or loaded from an entry point).

Everything refused here is refused by name (the plugin and the hook) in a
:class:`~torchkiln.PluginError`, before any of the plugin's implementations is called: a hook
torchkiln does not define, a wrapper pluggy cannot run, a plain implementation that is a
generator (what torchkiln would get is the generator), declarations whose serving hook is
missing.
"""

from __future__ import annotations

import inspect
import re
import warnings
from typing import Any

import pluggy

from torchkiln.configuration.config_values import did_you_mean
from torchkiln.errors import PluginError
from torchkiln.plugin_host.plugin_info import DECLARATIONS


def specified_hooks(pm: pluggy.PluginManager) -> list[str]:
    """The hooks torchkiln specifies (not names a plugin implemented without a spec)."""
    return sorted(
        name
        for name, caller in vars(pm.hook).items()
        if not name.startswith("_") and getattr(caller, "spec", None) is not None
    )


def _implementations(pm: pluggy.PluginManager, plugin: object) -> list[tuple[str, str, Any]]:
    """``(hook name, attribute, hookimpl options)`` for each ``@hookimpl`` attribute of
    ``plugin``; the hook name is the option ``specname`` when it is given."""
    found = []
    for attr in dir(plugin):
        try:
            opts = pm.parse_hookimpl_opts(plugin, attr)
        except Exception:  # an attribute that fails to be read implements no hook
            continue
        if opts is not None:
            found.append((opts.get("specname") or attr, attr, opts))
    return found


def implemented_hooks(pm: pluggy.PluginManager, plugin: object) -> tuple[str, ...]:
    """The hooks ``plugin`` implements or wraps (its ``@hookimpl`` attributes), sorted."""
    return tuple(sorted({hook for hook, _, _ in _implementations(pm, plugin)}))


def _plain_hooks(pm: pluggy.PluginManager, plugin: object) -> set[str]:
    """The hooks ``plugin`` implements with a plain (non-wrapper) implementation."""
    return {
        hook
        for hook, _, opts in _implementations(pm, plugin)
        if not (opts.get("wrapper") or opts.get("hookwrapper"))
    }


def check_plugin(pm: pluggy.PluginManager, name: str, plugin: object, *, strict: bool) -> None:
    """Reject hook implementations for hooks torchkiln does not define (typos) and
    implementations pluggy cannot call as marked; warn about (under ``strict``, reject)
    declarations without the hook that serves them.

    :raises PluginError: naming the plugin and the hook.
    """
    known = specified_hooks(pm)
    for hook_name, attr, opts in _implementations(pm, plugin):
        if hook_name not in known:
            raise PluginError(
                f"plugin {name!r} implements unknown hook {hook_name!r}"
                f"{did_you_mean(hook_name, known)}; torchkiln hooks: " + ", ".join(known),
                plugin=name,
                hook=hook_name,
            )
        _check_wrapper_marks(name, hook_name, getattr(plugin, attr), opts)
    _check_serving_hooks(pm, name, plugin, strict=strict)


def _check_wrapper_marks(name: str, hook_name: str, function: Any, opts: Any) -> None:
    """A wrapper must be a generator function and a plain implementation must not be one:
    torchkiln calls every hook through pluggy, which runs a wrapper's code around the call by
    its ``yield`` and hands a plain implementation's return value on as it is."""
    wrapper, hookwrapper = bool(opts.get("wrapper")), bool(opts.get("hookwrapper"))
    generator = inspect.isgeneratorfunction(function)
    where = f"plugin {name!r}: its {hook_name} implementation"
    problem = None
    if wrapper and hookwrapper:
        problem = "is marked both wrapper=True and hookwrapper=True; use one (wrapper=True)"
    elif (wrapper or hookwrapper) and not generator:
        mark = "wrapper=True" if wrapper else "hookwrapper=True"
        problem = (
            f"is marked {mark} but is not a generator function: a wrapper yields once, where "
            "the implementations run"
        )
    elif generator and not (wrapper or hookwrapper):
        problem = (
            "is a generator function but is not marked as a wrapper, so torchkiln would get a "
            "generator as its result: mark it @hookimpl(wrapper=True) to wrap the hook"
        )
    if problem is not None:
        raise PluginError(f"{where} {problem}", plugin=name, hook=hook_name)


def _check_serving_hooks(
    pm: pluggy.PluginManager, name: str, plugin: object, *, strict: bool
) -> None:
    """A plugin that declares names must implement (not just wrap) the hook that serves them."""
    plain = _plain_hooks(pm, plugin)
    for declaration, (_, _, serving) in DECLARATIONS.items():
        if declaration in plain and serving and serving not in plain:
            if declaration == "declare_backends" and _backends_carry_compile(plugin):
                continue
            message = (
                f"plugin {name!r} implements {declaration} but not {serving}: the names it "
                f"declares are refused when a configuration uses them; add a @hookimpl "
                f"{serving}"
            )
            if strict:
                raise PluginError(
                    message + " (TORCHKILN_STRICT_PLUGINS=1)", plugin=name, hook=serving
                )
            # Called by check_plugin from PluginManager.register: the level counts on that depth.
            warnings.warn(message, RuntimeWarning, stacklevel=5)


def _backends_carry_compile(plugin: object) -> bool:
    """Whether every backend ``plugin`` declares carries its compile (``BackendSpec.compile``):
    then it needs no ``compile_region``. A declaration that fails here is left to the
    collection, which quarantines the plugin with the reason."""
    declare = getattr(plugin, "declare_backends", None)
    try:
        specs = list(declare() or ()) if callable(declare) else []
    except Exception:
        return False
    return bool(specs) and all(getattr(spec, "compile", None) is not None for spec in specs)


_FOR_HOOK = re.compile(r"for hook '([A-Za-z_][A-Za-z0-9_]*)'")


def refused_by_pluggy(name: str, error: pluggy.PluginValidationError) -> PluginError:
    """The :class:`PluginError` for what pluggy refuses at registration (an argument the hook
    does not have, say), naming the plugin and, where pluggy says it, the hook."""
    found = _FOR_HOOK.search(str(error))
    hook_name = found.group(1) if found else None
    where = f" {hook_name}" if hook_name else ""
    detail = str(error).splitlines()[-1]
    return PluginError(
        f"plugin {name!r}: its{where} implementation is refused by pluggy: {detail}",
        plugin=name,
        hook=hook_name,
    )
