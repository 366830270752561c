"""Deprecated (plugin API v1): import these names from :mod:`torchkiln.plugin`."""

from torchkiln.plugin import HOOK_NAMES
from torchkiln.v1_compat import moved_names

__getattr__ = moved_names(
    __name__,
    {
        "PROJECT_NAME": "torchkiln.plugin",
        "hookimpl": "torchkiln.plugin",
        "hookspec": "torchkiln.plugin",
        **dict.fromkeys(HOOK_NAMES, "torchkiln.plugin_host.hooks"),
    },
)
