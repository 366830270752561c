"""Helpers for backend plugins: compile with torch, probe a vendor module, know torch's names.

None of them imports a vendor library until it is called.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torchkiln.plugin_host.declarations import Availability

if TYPE_CHECKING:
    from torchkiln.configuration.config import CompileConfig


DynamoBackend = Callable[..., Callable[..., Any]]
"""A ``torch.compile`` backend function: ``(graph_module, example_inputs) -> callable``."""


def compile_with_torch(
    fn: Callable[..., Any], config: CompileConfig, backend: str | DynamoBackend | None = None
) -> Callable[..., Any]:
    """``torch.compile(fn)`` with the configured ``mode``, ``fullgraph``, ``dynamic`` and
    ``options``, for ``backend`` (default: ``config.backend``; pass the torch name a vendor
    registered when it differs from the torchkiln one, or a backend function of your own, such
    as one that rewrites the graph and hands it on with :func:`torch_backend`).

    ``options`` is copied (``torch.compile`` pops keys out of it) and passed as ``None`` when
    empty, ``mode`` as ``None`` when unset: torch refuses ``mode`` and ``options`` together.
    """
    import torch

    return torch.compile(
        fn,
        backend=backend or config.backend,
        mode=config.mode,
        fullgraph=config.fullgraph,
        dynamic=config.dynamic,
        options=dict(config.options) or None,
    )


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


def torch_backend_names() -> list[str]:
    """Every backend ``torch._dynamo`` knows (debug and entry-point ones included), lower case."""
    import torch.compiler

    return sorted(name.lower() for name in torch.compiler.list_backends(exclude_tags=()))


def torch_backend(name: str) -> DynamoBackend:
    """The backend function torch registered as ``name`` (``"inductor"``, ``"aot_eager"``,
    ``"eager"``...), for a wrapping backend to hand its graph on to::

        def acme_backend(graph_module, example_inputs):
            rewrite(graph_module)  # the vendor's own passes
            return torch_backend("inductor")(graph_module, example_inputs)

    :raises ValueError: naming the names torch knows, when it knows no ``name``.
    """
    from torchkiln._internals import dynamo

    if not torch_knows(name):
        raise ValueError(
            f"torch knows no backend {name!r}; known: {', '.join(torch_backend_names())}"
        )
    found: DynamoBackend = dynamo.lookup_backend(name.lower())
    return found


def torch_knows(name: str) -> bool:
    """Whether ``torch._dynamo`` has a backend called ``name`` (entry-point ones included)."""
    return name.lower() in torch_backend_names()
