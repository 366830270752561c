"""What a plugin implements, and the checks it passes when it is registered: it implements no
hook torchkiln does not specify (a typo), and declares no name without the hook that serves it.

The functions take pluggy's manager, not torchkiln's, so this module does not import
:mod:`torchkiln.plugin_host.plugin_manager` (which imports it).
"""

from __future__ import annotations

import difflib
import warnings

import pluggy

from torchkiln.errors import PluginError
from torchkiln.plugin_host.plugin_info import IMPLEMENTING_HOOK


def specified_hooks(pm: pluggy.PluginManager) -> list[str]:
    """The hooks torchkiln specifies (not names a plugin implemented without a spec)."""
    return sorted(
        name
        for name, caller in vars(pm.hook).items()
        if not name.startswith("_") and getattr(caller, "spec", None) is not None
    )


def implemented_hooks(pm: pluggy.PluginManager, plugin: object) -> tuple[str, ...]:
    """The hooks ``plugin`` implements (its ``@hookimpl`` attributes), sorted."""
    names = []
    for attr in dir(plugin):
        try:
            if pm.parse_hookimpl_opts(plugin, attr) is not None:
                names.append(attr)
        except Exception:  # an attribute that fails to be read implements no hook
            continue
    return tuple(sorted(names))


def check_plugin(pm: pluggy.PluginManager, name: str, plugin: object, *, strict: bool) -> None:
    """Reject hook implementations for hooks torchkiln does not define (typos); warn about
    (under ``strict``, reject) declarations without the hook that serves them.

    :raises PluginError: naming the plugin and the hook.
    """
    known = specified_hooks(pm)
    implemented = implemented_hooks(pm, plugin)
    for hook_name in implemented:
        if hook_name not in known:
            raise PluginError(
                f"plugin {name!r} implements unknown hook {hook_name!r}"
                f"{_did_you_mean(hook_name, known)}; torchkiln hooks: " + ", ".join(known),
                plugin=name,
                hook=hook_name,
            )
    for declaration, serving in IMPLEMENTING_HOOK.items():
        if declaration in implemented and serving not in implemented:
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
            # Called directly by PluginManager.register: the level counts on that depth.
            warnings.warn(message, RuntimeWarning, stacklevel=4)


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


def _did_you_mean(hook_name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(hook_name, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
