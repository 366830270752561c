"""transformers' private state that torchkiln reads or sets (output capturing:
``transformers.utils.output_capturing``).

Nothing here imports transformers unless said so.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import Any


def guards_can_record_registry(guard_name: str) -> bool:
    """Whether a Dynamo guard (by its source name) checks :func:`can_record_registry`'s
    entries: ``G['__import_transformers...output_capturing']._CAN_RECORD_REGISTRY[...]``.
    Verified: torch 2.11, 2.13, 2.14, 2.15 (transformers 5.25)."""
    return "._CAN_RECORD_REGISTRY" in guard_name


def can_record_registry() -> dict[Any, Any] | None:
    """transformers' registry of recordable outputs per model (a ``dict`` subclass, in the
    order models registered), or ``None`` where transformers has not loaded it (or has none).

    Reads ``transformers.utils.output_capturing._CAN_RECORD_REGISTRY`` from ``sys.modules``
    (imports nothing): ``PreTrainedModel.__init__`` fills it, Dynamo guards on its entries by
    position, and transformers has no public accessor. Use ``dict``'s own methods on it
    (``dict.items(registry)``): the subclass overrides some. Verified: torch 2.11, 2.13, 2.14,
    2.15 (transformers 5.24).
    """
    module = sys.modules.get("transformers.utils.output_capturing")
    return getattr(module, "_CAN_RECORD_REGISTRY", None)


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


def replace_can_record_registry(registry: dict[Any, Any], items: Iterable[Any]) -> None:
    """Make ``registry`` (:func:`can_record_registry`) hold exactly ``items`` (``(model,
    outputs)`` pairs), in their order: Dynamo guards on its entries by position.

    Writes through ``dict``'s own ``clear`` and ``__setitem__``: the registry's subclass
    overrides them (a weak-keyed registry). Verified: torch 2.11, 2.13, 2.14, 2.15
    (transformers 5.25).
    """
    dict.clear(registry)
    for key, value in items:
        dict.__setitem__(registry, key, value)


def register_can_record(registry: dict[Any, Any], model: Any) -> None:
    """Register ``model``'s recordable outputs in ``registry``, as its ``__init__`` does (a
    model loaded by unpickling skipped it); a module declaring none, or with no ``config``, is
    left out. Verified: torch 2.11, 2.13, 2.14, 2.15 (transformers 5.25)."""
    outputs = can_record_outputs(model)
    if outputs is not None and hasattr(model, "config"):
        registry[model] = outputs


def call_collecting_per_block(
    collector: Any, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
) -> Any:
    """``fn(*args, **kwargs)``, one block's call, with the collector (:func:`active_collector`)
    in its compile-friendly mode for that call only, then restored; as is when the collector is
    in that mode already (an outer ``torch.compile``).

    ``ContextVar.get`` cannot be traced, the collector's ``global_var`` (what transformers itself
    uses under ``torch.compile``) can: the outputs the model's call collects (its
    ``context_var``) are handed over through it. Capture hooks inside a block (the attention
    module's, for ``output_attentions``) append to the collector's lists; traced, Dynamo guards
    on their length, which grows by one per layer, so each layer would compile its own graph.
    So the block collects into fresh lists, appended to the call's afterwards;
    ``hidden_states`` stays shared, as its hook numbers layers by the list's length.

    One function, not several small ones: it runs in front of every block's call (principle 6).
    Reads ``compiling`` and ``context_var``, sets ``global_var`` and ``compiling``.
    Verified: torch 2.13 (transformers 5.25).
    """
    if collector.compiling:
        return fn(*args, **kwargs)
    collected = collector.context_var.get()
    own = collected
    if collected:
        own = {
            key: [] if key != "hidden_states" and isinstance(value, list) else value
            for key, value in collected.items()
        }
    collector.global_var = own
    collector.compiling = True
    try:
        output = fn(*args, **kwargs)
    finally:
        collector.global_var = None
        collector.compiling = False
    if own is not collected:
        for key, value in own.items():
            if value is not collected[key]:
                collected[key].extend(value)
    return output
