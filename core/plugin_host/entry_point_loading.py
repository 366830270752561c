"""Installed plugins (the ``torchkiln`` entry-point group): which of them load, in which order,
and what is recorded about one that loaded or failed to load.

``TORCHKILN_PLUGINS`` and ``TORCHKILN_DISABLED_PLUGINS`` choose them; the plugin manager
registers them (:mod:`torchkiln.plugin_host.plugin_manager` documents the variables).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from importlib import metadata

from torchkiln.errors import PluginError
from torchkiln.plugin_host.plugin_env import env_names
from torchkiln.plugin_host.plugin_info import FailedPlugin, PluginInfo

ENTRY_POINT_GROUP = "torchkiln"


def installed_plugin_names() -> list[str]:
    """The entry-point names of the installed plugins, sorted, each once."""
    return sorted({ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)})


def entry_points_to_load(
    env: Mapping[str, str], disabled: set[str]
) -> tuple[list[metadata.EntryPoint], list[str]]:
    """The installed plugins ``TORCHKILN_PLUGINS`` allows, in registration order, each name
    once; and the names ``disabled`` (``TORCHKILN_DISABLED_PLUGINS``, lower case) blocks."""
    only = {n.lower() for n in env_names(env, "TORCHKILN_PLUGINS") or ()} or None
    seen: set[str] = set()
    allowed: list[metadata.EntryPoint] = []
    blocked: list[str] = []
    for entry_point in load_order(metadata.entry_points(group=ENTRY_POINT_GROUP), env):
        if entry_point.name in seen:
            continue
        seen.add(entry_point.name)
        if entry_point.name.lower() in disabled:
            blocked.append(entry_point.name)
        elif only is None or entry_point.name.lower() in only:
            allowed.append(entry_point)
    return allowed, blocked


def load_order(
    entry_points: Iterable[metadata.EntryPoint], env: Mapping[str, str]
) -> list[metadata.EntryPoint]:
    """Registration order: the plugin registered last is called first and wins a name, so
    the one that must win (first in ``TORCHKILN_PLUGINS``, else the first by name) is
    registered last. The order Python finds distributions in never matters."""
    listed = [n.strip().lower() for n in env.get("TORCHKILN_PLUGINS", "").split(",")]
    rank = {name: index for index, name in reversed(list(enumerate(listed))) if name}

    def precedence(entry_point: metadata.EntryPoint) -> tuple[int, str, str]:
        name = entry_point.name.lower()
        return (rank.get(name, len(rank)), name, entry_point.value)

    return sorted(entry_points, key=precedence, reverse=True)


def loaded_plugin_info(entry_point: metadata.EntryPoint, hooks: tuple[str, ...]) -> PluginInfo:
    """What ``torchkiln plugins`` shows about an installed plugin that loaded."""
    distribution, version = _distribution(entry_point)
    return PluginInfo(
        entry_point.name, "entry-point", hooks, distribution, version, entry_point.value
    )


def load_failure(entry_point: metadata.EntryPoint, error: Exception) -> FailedPlugin:
    """What is recorded about an installed plugin that failed to import or to register."""
    distribution, version = _distribution(entry_point)
    return FailedPlugin(
        entry_point.name,
        entry_point.value,
        distribution,
        version,
        f"{type(error).__name__}: {error}",
    )


def strict_load_error(failure: FailedPlugin, error: Exception) -> PluginError:
    """What ``TORCHKILN_STRICT_PLUGINS=1`` raises instead of skipping the plugin."""
    return PluginError(
        failure.describe().replace("was skipped", "was not loaded")
        + " (TORCHKILN_STRICT_PLUGINS=1)",
        plugin=failure.name,
        hook=getattr(error, "hook", None),
    )


def _distribution(entry_point: metadata.EntryPoint) -> tuple[str | None, str | None]:
    """The name and version of the distribution that installed ``entry_point``, if known
    (an entry point made by hand has none)."""
    dist = getattr(entry_point, "dist", None)
    if dist is None:
        return None, None
    return dist.metadata["Name"], dist.version
