"""Loading plugins: the ``TORCHKILN_*`` plugin controls, which installed plugins (the
``torchkiln`` entry-point group) load and in which order, the checks a plugin passes when it is
registered, and the hook-call trace of ``TORCHKILN_TRACE_PLUGINS=1``. The functions take
pluggy's manager: :mod:`.plugin_manager` imports this module, not the other way round.
"""

from __future__ import annotations

import difflib
import sys
import warnings
from collections.abc import Mapping, Sequence
from importlib import metadata
from typing import Any

import pluggy

from torchkiln.configuration.config_sources import ENV_TRUE
from torchkiln.configuration.config_values import did_you_mean
from torchkiln.errors import PluginError
from torchkiln.plugin_host.plugin_info import DECLARATIONS

# --- the environment controls and the trace ------------------------------------------------------


def env_flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() in ENV_TRUE


def env_names(env: Mapping[str, str], name: str) -> set[str]:
    return {part.strip() for part in env.get(name, "").split(",") if part.strip()}


def short(value: Any, limit: int = 200) -> str:
    text = " ".join(repr(value).split())  # one line per trace record, even for modules
    return text if len(text) <= limit else text[: limit - 3] + "..."


def trace_before(hook_name: str, impls: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    args = ", ".join(f"{k}={short(v)}" for k, v in kwargs.items())
    plugins = ", ".join(impl.plugin_name for impl in reversed(impls))
    print(f"torchkiln: hook {hook_name}({args}) -> plugins [{plugins}]", file=sys.stderr)


def trace_after(
    outcome: Any, hook_name: str, impls: Sequence[Any], kwargs: Mapping[str, Any]
) -> None:
    exception = outcome.exception
    shown = f"raised {exception!r}" if exception is not None else short(outcome.get_result())
    print(f"torchkiln: hook {hook_name} returned {shown}", file=sys.stderr)


def warn_unknown_names(
    env: Mapping[str, str], external: Sequence[str], builtins: Sequence[str]
) -> None:
    """A ``RuntimeWarning`` for each name in ``TORCHKILN_PLUGINS`` / ``TORCHKILN_DISABLED_PLUGINS``
    that matches no built-in and no installed entry point, with the closest known name."""
    for variable, known, what in (
        ("TORCHKILN_PLUGINS", external, "installed plugin (entry-point name)"),
        ("TORCHKILN_DISABLED_PLUGINS", [*builtins, *external], "plugin"),
    ):
        lowered = {name.lower(): name for name in known}
        # "tensorrt" is close to "torchkiln.tensorrt": compare with the short names too.
        candidates = {**{n.removeprefix("torchkiln."): n for n in lowered}, **lowered}
        for name in sorted(env_names(env, variable)):
            if name.lower() in lowered:
                continue
            close = difflib.get_close_matches(name.lower(), list(candidates), n=1)
            hint = f" (did you mean {lowered[candidates[close[0]]]!r}?)" if close else ""
            warnings.warn(
                f"{variable}: {name!r} matches no {what}{hint}; names are matched "
                f"case-insensitively; known: {', '.join(known) or 'none'}",
                RuntimeWarning,
                stacklevel=3,  # the caller of PluginManager.ensure_loaded
            )


def call_traced(hook_name: str, impl: Any, kwargs: Mapping[str, Any]) -> Any:
    """Call one implementation (a pluggy ``HookImpl``) with the ``kwargs`` it takes, printing
    the call and its result (or what it raised) as :func:`trace_before` / :func:`trace_after`
    print a ``pm.hook`` call."""
    args = ", ".join(f"{k}={short(v)}" for k, v in kwargs.items())
    where = f"{hook_name} [{impl.plugin_name}]"
    print(f"torchkiln: hook {hook_name}({args}) -> plugin {impl.plugin_name}", file=sys.stderr)
    try:
        result = impl.function(**{name: kwargs[name] for name in impl.argnames})
    except Exception as error:
        print(f"torchkiln: hook {where} raised {error!r}", file=sys.stderr)
        raise
    print(f"torchkiln: hook {where} returned {short(result)}", file=sys.stderr)
    return result


# --- installed plugins ---------------------------------------------------------------------------

ENTRY_POINT_GROUP = "torchkiln"


def installed_plugin_names() -> list[str]:
    """The entry-point names of the installed plugins, sorted, each once."""
    return sorted({ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)})


def entry_points_to_load(
    env: Mapping[str, str], disabled: set[str]
) -> tuple[list[metadata.EntryPoint], list[str]]:
    """The installed plugins ``TORCHKILN_PLUGINS`` allows, in registration order, each name
    once; and the names ``disabled`` (``TORCHKILN_DISABLED_PLUGINS``, lower case) blocks.

    The plugin registered last is called first and wins a name, so the one that must win
    (first in ``TORCHKILN_PLUGINS``, else the first by name) is registered last. The order
    Python finds distributions in never matters."""
    listed = [n.strip().lower() for n in env.get("TORCHKILN_PLUGINS", "").split(",")]
    rank = {name: index for index, name in reversed(list(enumerate(listed))) if name}

    def precedence(entry_point: metadata.EntryPoint) -> tuple[int, str, str]:
        name = entry_point.name.lower()
        return (rank.get(name, len(rank)), name, entry_point.value)

    installed = metadata.entry_points(group=ENTRY_POINT_GROUP)
    seen: set[str] = set()
    allowed: list[metadata.EntryPoint] = []
    blocked: list[str] = []
    for entry_point in sorted(installed, key=precedence, reverse=True):
        if entry_point.name in seen:
            continue
        seen.add(entry_point.name)
        if entry_point.name.lower() in disabled:
            blocked.append(entry_point.name)
        elif not rank or entry_point.name.lower() in rank:
            allowed.append(entry_point)
    return allowed, blocked


def distribution_of(entry_point: metadata.EntryPoint) -> tuple[str | None, str | None]:
    """The name and version of the distribution that installed ``entry_point``, if known
    (an entry point made by hand has none)."""
    dist = getattr(entry_point, "dist", None)
    if dist is None:
        return None, None
    return dist.metadata["Name"], dist.version


# --- checks at registration -----------------------------------------------------------------------


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
                f"{did_you_mean(hook_name, known)}; torchkiln hooks: " + ", ".join(known),
                plugin=name,
                hook=hook_name,
            )
    for declaration, (_, _, serving) in DECLARATIONS.items():
        if declaration in implemented and serving and serving not in implemented:
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
