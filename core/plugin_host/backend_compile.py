"""The ``compile_region`` implementation of a backend object.

A backend that carries its compile (``BackendSpec.compile``, every built-in backend and the
vendor ones), and a name only torch knows (``torch.compile`` itself), is compiled through the
``compile_region`` hook like a plugin's own ``compile_region``: the implementation made here
takes part in that one call, credited to the plugin that declared the backend, so that every
wrapper of ``compile_region`` sees each group's compile whatever the backend.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pluggy import HookImpl

from torchkiln.plugin_host.hook_calls import added_implementation
from torchkiln.plugin_host.torch_backends import compile_with_torch

if TYPE_CHECKING:
    from torchkiln.configuration.config import CompileConfig
    from torchkiln.plugin_host.declarations import BackendSpec
    from torchkiln.plugin_host.plugin_info import Declared
    from torchkiln.plugin_host.region_plan import RegionGroup


class BackendCompile:
    """``compile_region`` for one declared backend object: its ``compile``, or for a name only
    torch knows (no ``compile``), ``torch.compile`` with the configured options."""

    def __init__(self, spec: BackendSpec) -> None:
        self.spec = spec

    def compile_region(
        self, fn: Callable[..., Any], group: RegionGroup, config: CompileConfig, backend: str
    ) -> Any:
        if self.spec.compile is None:
            return compile_with_torch(fn, config, backend)
        return self.spec.compile(fn, group, config)


def backend_implementation(declared: Declared[BackendSpec]) -> HookImpl:
    """The ``compile_region`` implementation that compiles with ``declared``'s backend object."""
    return added_implementation(declared.plugin, BackendCompile(declared.spec).compile_region)
