"""Shared by the vendor backend plugins (``xla``, ``hpu``, ``neuron``, ``tensorrt``, ``tvm``).

Two small things every one of them needs: a probe that imports the vendor module without ever
raising, and the hand-off of a region to ``torch.compile`` under the torch backend name the
vendor registered. Neither imports a vendor library until it is called.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torchkiln.specs import Availability

if TYPE_CHECKING:
    from torchkiln.config import CompileConfig


def probe_import(module: str, install_hint: str) -> Availability:
    """Import ``module``; say why not in words a user can act on. Never raises."""
    package = module.split(".", 1)[0]
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name == package:
            return Availability.no(f"{package} is not installed: {install_hint}")
        if error.name and module.startswith(error.name):
            return Availability.no(
                f"the installed {package} has no {error.name} (too old or incomplete?): "
                f"{install_hint}"
            )
        return Availability.no(f"importing {module} failed: {error}")
    except Exception as error:  # a broken vendor install can raise anything at import time
        return Availability.no(f"importing {module} failed: {type(error).__name__}: {error}")
    return Availability.yes()


def torch_knows(name: str) -> bool:
    """Whether ``torch._dynamo`` has a backend called ``name`` (entry-point ones included)."""
    import torch._dynamo

    return name in torch._dynamo.list_backends(exclude_tags=())


def compile_with_torch(
    fn: Callable[..., Any], config: CompileConfig, torch_backend: str
) -> Callable[..., Any]:
    """``torch.compile(fn)`` with the configured ``mode``/``fullgraph``/``dynamic``/``options``.

    ``options`` is copied because ``torch.compile`` pops keys out of it, and passed as ``None``
    when empty because torch refuses ``mode`` and ``options`` together.
    """
    import torch

    return torch.compile(
        fn,
        backend=torch_backend,
        mode=config.mode,
        fullgraph=config.fullgraph,
        dynamic=config.dynamic,
        options=dict(config.options) or None,
    )
