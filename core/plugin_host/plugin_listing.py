"""What the plugin manager tells about its plugins: every registered plugin (``torchkiln
plugins`` lists them), every backend name torch knows besides the declared ones, and, when a
name is missing, the plugins disabled, failed or quarantined that might have declared it.

The functions take pluggy's manager, not torchkiln's, so this module does not import
:mod:`torchkiln.plugin_host.plugin_manager` (which imports it).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import pluggy

from torchkiln.plugin_host.declarations import BackendSpec
from torchkiln.plugin_host.plugin_checks import implemented_hooks
from torchkiln.plugin_host.plugin_info import Declared, FailedPlugin, PluginInfo
from torchkiln.plugin_host.torch_backends import torch_backend_names

_KIND_ORDER = {"builtin": 0, "entry-point": 1, "registered": 2}


def registered_plugins(
    pm: pluggy.PluginManager,
    installed: Mapping[str, PluginInfo],
    builtin_names: Collection[str],
) -> list[PluginInfo]:
    """Every registered plugin: built-ins, then ``installed`` ones (entry points, by registered
    name), then the others, each kind by name. A blocked name is no plugin."""
    infos = []
    for name, plugin in pm.list_name_plugin():
        if plugin is None:  # blocked (TORCHKILN_DISABLED_PLUGINS): pluggy keeps the name
            continue
        if name in installed:
            infos.append(installed[name])
        else:
            kind = "builtin" if name in builtin_names else "registered"
            infos.append(PluginInfo(name, kind, implemented_hooks(pm, plugin)))
    return sorted(infos, key=lambda info: (_KIND_ORDER[info.kind], info.name))


def with_torch_backends(
    declared: Mapping[str, Declared[BackendSpec]],
) -> dict[str, Declared[BackendSpec]]:
    """``declared``, then every other name torch's backend registry knows (served by
    ``torch.compile`` itself, origin ``torch``)."""
    backends = dict(declared)
    for name in torch_backend_names():
        if name not in backends:
            spec = BackendSpec(name, description="registered with torch._dynamo", origin="torch")
            backends[name] = Declared(spec, "torch")
    return backends


def missing_hint(pm: pluggy.PluginManager, failed: Sequence[FailedPlugin]) -> str:
    """``" (disabled ...; failed to load ...)"``: why a name might be missing, or ``""``."""
    parts = []
    blocked = sorted(name for name, plugin in pm.list_name_plugin() if plugin is None)
    if blocked:
        parts.append("plugins disabled by TORCHKILN_DISABLED_PLUGINS: " + ", ".join(blocked))
    not_loaded = sorted(f.name for f in failed if f.hook is None)
    if not_loaded:
        parts.append("plugins that failed to load: " + ", ".join(not_loaded))
    quarantined = sorted(
        f"plugin {f.name!r} (its {f.reason})" for f in failed if f.hook is not None
    )
    if quarantined:
        parts.append("plugins quarantined, their names unavailable: " + ", ".join(quarantined))
    return f" ({'; '.join(parts)})" if parts else ""
