"""torch.distributed's private composable APIs that torchkiln calls
(``torch.distributed._composable``), and how a ``fully_shard`` block unpickles."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn


def checkpoint_activations(module: nn.Module) -> None:
    """Make ``module`` recompute its activations in the backward pass instead of keeping them
    (in place: ``module`` stays the same object, with the same parameter names).

    Calls ``torch.distributed._composable.checkpoint``, the composable form ``fully_shard``
    works with; ``torch.utils.checkpoint`` wraps a function call, not a module in place.
    Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    from torch.distributed._composable import checkpoint

    checkpoint(module)


def _same_class(cls: type, *args: Any, **kwargs: Any) -> Any:
    return object.__new__(cls)


@contextlib.contextmanager
def fsdp_classes_kept() -> Iterator[None]:
    """While the block runs (torch loading a saved compiled function), an object of a class
    ``fully_shard`` made (``FSDPLlamaDecoderLayer``) unpickles as that class, not as the class
    it was made from.

    ``FSDPModule.__new__`` builds the original class (so that indexing a sharded container gives
    plain modules), and torch's guard-state pickler rebuilds a saved function's guarded module
    with ``type(obj).__new__``: the rebuilt block's MRO then lacks ``FSDPModule``, and a guard
    that reaches a class attribute by its MRO position (a transformers block's
    ``gradient_checkpointing``, ``__mro__[3]``) fails to rebuild (``KeyError``). Replaces
    ``FSDPModule.__new__`` for the block only (no public way to unpickle it as itself); nothing
    when FSDP2 was never imported. Verified: torch 2.13, 2.15.
    """
    fsdp = sys.modules.get("torch.distributed.fsdp")
    fsdp_module = getattr(fsdp, "FSDPModule", None)
    original = vars(fsdp_module).get("__new__") if fsdp_module is not None else None
    if original is None:
        yield
        return
    setattr(fsdp_module, "__new__", staticmethod(_same_class))  # noqa: B010 (a dunder)
    try:
        yield
    finally:
        setattr(fsdp_module, "__new__", original)  # noqa: B010


def activation_wrapped(block: nn.Module) -> nn.Module:
    """The block inside torch's activation wrappers (``checkpoint_wrapper``, ``offload_wrapper``:
    Accelerate's FSDP2 activation checkpointing wraps each block before compiling), whose
    ``forward(*args, **kwargs)`` passes every argument on unchanged; else ``block``.

    Reads ``_checkpoint_wrapped_module``, the wrapped module's attribute name in
    ``torch.distributed.algorithms._checkpoint.checkpoint_wrapper``: no public accessor.
    Verified: torch 2.11, 2.13, 2.15.
    """
    from torch import nn

    wrapped = getattr(block, "_checkpoint_wrapped_module", None)
    while isinstance(wrapped, nn.Module):
        block, wrapped = wrapped, getattr(wrapped, "_checkpoint_wrapped_module", None)
    return block
