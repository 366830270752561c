"""transformers' private state that torchkiln reads or sets (output capturing:
``transformers.utils.output_capturing``).

Each function names what it touches, why no public API serves, and the torch releases it was
verified on; ``tests/internals/test_transformers_contracts.py`` checks each on every supported
torch. Nothing here imports transformers unless said so.
"""

from __future__ import annotations

import sys
from typing import Any

OUTPUT_CAPTURING = "transformers.utils.output_capturing"


def can_record_registry() -> dict[Any, Any] | None:
    """transformers' registry of recordable outputs per model (a ``dict`` subclass, in the
    order models registered), or ``None`` where transformers has not loaded it (or has none).

    Reads ``transformers.utils.output_capturing._CAN_RECORD_REGISTRY`` from ``sys.modules``
    (imports nothing): ``PreTrainedModel.__init__`` fills it, Dynamo guards on its entries by
    position, and transformers has no public accessor. Use ``dict``'s own methods on it
    (``dict.items(registry)``): the subclass overrides some. Verified: torch 2.11, 2.13, 2.14,
    2.15 (transformers 5.24).
    """
    module = sys.modules.get(OUTPUT_CAPTURING)
    registry: dict[Any, Any] | None = getattr(module, "_CAN_RECORD_REGISTRY", None)
    return registry


def can_record_outputs(module: Any) -> Any:
    """The outputs ``module`` (a transformers model) declares it can record, as
    :func:`can_record_registry` takes them; ``None`` where it declares none.

    Reads ``module._can_record_outputs``, a class attribute of transformers' models with no
    public accessor. Verified: torch 2.11, 2.13, 2.14, 2.15 (transformers 5.24).
    """
    return getattr(module, "_can_record_outputs", None)


def no_split_modules(model: Any) -> Any:
    """The block class names a transformers model declares it must not be split inside (one
    name or a list; ``None`` where it declares none, or is not a transformers model).

    Reads ``model._no_split_modules``, the class attribute ``device_map="auto"`` and FSDP
    wrapping policies read; transformers has no public accessor. Verified: torch 2.11, 2.13,
    2.14, 2.15 (transformers 5.24).
    """
    return getattr(model, "_no_split_modules", None)


def active_collector() -> Any:
    """transformers' output collector (a ``CompileableContextVar``: ``context_var``,
    ``global_var``, ``compiling``), through which blocks hand outputs to ``output_hidden_states``
    and ``output_attentions``. Imports ``transformers.utils.output_capturing``.

    Reads ``transformers.utils.output_capturing._active_collector``: transformers has no public
    accessor. Verified: torch 2.11, 2.13, 2.14, 2.15 (transformers 5.24).
    """
    from transformers.utils.output_capturing import _active_collector

    return _active_collector
