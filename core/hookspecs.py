"""Deprecated (plugin API v1): import these names from :mod:`torchkiln.plugin`."""

from torchkiln.v1_compat import moved_names

_SPECS = (
    "declare_backends",
    "declare_selectors",
    "declare_distributed",
    "resolve_compile_config",
    "select_regions",
    "wrap_distributed",
    "prepare_group",
    "compile_region",
)

__getattr__ = moved_names(
    __name__,
    {
        "PROJECT_NAME": "torchkiln.plugin",
        "hookimpl": "torchkiln.plugin",
        "hookspec": "torchkiln.plugin",
        **dict.fromkeys(_SPECS, "torchkiln.hooks"),
    },
)
