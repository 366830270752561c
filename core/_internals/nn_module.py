"""``torch.nn.Module``'s private dicts that torchkiln reads or writes (``_modules``,
``_parameters``, ``_buffers``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn


def child_modules(module: nn.Module) -> dict[str, Any]:
    """``module``'s own children by name, ``None`` entries included: the live dict, so that
    setting an entry replaces a child without ``__setattr__``.

    Reads ``nn.Module._modules``. ``named_children()`` skips ``None`` entries and repeats, and
    setting a child publicly goes through ``__setattr__``/``add_module``, which a subclass may
    override. Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    return module._modules


def own_parameters(module: nn.Module) -> dict[str, Any]:
    """``module``'s own parameters by name, ``None`` entries included (the live dict).

    Reads ``nn.Module._parameters``: ``named_parameters(recurse=False)`` skips ``None`` entries
    and repeats of one tensor. Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    return module._parameters


def own_buffers(module: nn.Module) -> dict[str, Any]:
    """``module``'s own buffers by name, ``None`` entries included (the live dict).

    Reads ``nn.Module._buffers``: ``named_buffers(recurse=False)`` skips ``None`` entries and
    repeats of one tensor. Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    return module._buffers
