"""Loading plugins: the ``TORCHKILN_*`` plugin controls, which installed plugins (the
``torchkiln`` entry-point group) load and in which order, and the hook-call trace of
``TORCHKILN_TRACE_PLUGINS=1``. The checks a plugin passes when it is registered are
:mod:`.registration_checks`.
"""

from __future__ import annotations

import difflib
import sys
import warnings
from collections.abc import Mapping, Sequence
from importlib import metadata
from typing import Any

from pluggy import HookImpl

from torchkiln.configuration.config_sources import ENV_TRUE
from torchkiln.plugin_host.hook_calls import is_wrapper

# --- the environment controls and the trace ------------------------------------------------------


def env_flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() in ENV_TRUE


def env_names(env: Mapping[str, str], name: str) -> set[str]:
    return {part.strip() for part in env.get(name, "").split(",") if part.strip()}


def short(value: Any, limit: int = 200) -> str:
    text = " ".join(repr(value).split())  # one line per trace record, even for modules
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _served_and_wrappers(impls: Sequence[HookImpl]) -> tuple[list[str], list[str]]:
    """The plugin names of ``impls``' plain implementations and of its wrappers, in call order."""
    ordered = list(reversed(impls))
    return (
        [impl.plugin_name for impl in ordered if not is_wrapper(impl)],
        [impl.plugin_name for impl in ordered if is_wrapper(impl)],
    )


def trace_before(hook_name: str, impls: Sequence[HookImpl], kwargs: Mapping[str, Any]) -> None:
    args = ", ".join(f"{k}={short(v)}" for k, v in kwargs.items())
    served, wrappers = _served_and_wrappers(impls)
    # torchkiln calls one implementation at a time; pm.hook.<name>() by hand may call several.
    target = f"plugin {served[0]}" if len(served) == 1 else f"plugins [{', '.join(served)}]"
    inside = f" inside wrappers [{', '.join(wrappers)}]" if wrappers else ""
    print(f"torchkiln: hook {hook_name}({args}) -> {target}{inside}", file=sys.stderr)


def trace_after(
    outcome: Any, hook_name: str, impls: Sequence[HookImpl], kwargs: Mapping[str, Any]
) -> None:
    served, _ = _served_and_wrappers(impls)
    where = f"{hook_name} [{served[0]}]" if len(served) == 1 else hook_name
    exception = outcome.exception
    shown = (
        f"raised {exception!r}"
        if exception is not None
        else f"returned {short(outcome.get_result())}"
    )
    print(f"torchkiln: hook {where} {shown}", file=sys.stderr)


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
