"""A block's plain attributes: the values Dynamo bakes into compiled code as constants.

``self.scaling = head_dim ** -0.5``, ``self.layer_idx``, a process group's name kept on a module,
a config's fields: Dynamo reads such values while it traces and writes them into the graph (and
guards on them). Two ranks whose block differs in one of them trace different code under the
same source, classes and parameter layout, so they are part of a group's share key
(:mod:`torchkiln.jobs.keys`): a rank whose value differs (a rank-dependent constant, the hazard of
pytorch#191878) compiles its own, and the report names the attribute.

Only public attribute names are read (torch's registries, hooks and engines' state are private),
and only values that are plain data: numbers, strings, booleans, ``None``, dtypes and devices,
and lists, tuples and dicts of them; an object with ``to_dict`` (a transformers config) counts
by its plain fields. Other objects are left out: what they hold is not read by value here.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

_LEFT_OUT = object()
MAX_DEPTH = 4
"""Nested containers deeper than this are left out (configs nest two or three levels)."""


def _plain(value: Any, depth: int = 0) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, torch.dtype | torch.device):
        return str(value)
    if depth >= MAX_DEPTH:
        return _LEFT_OUT
    if isinstance(value, list | tuple):
        items = [_plain(item, depth + 1) for item in value]
        return [item for item in items if item is not _LEFT_OUT]
    if isinstance(value, dict):
        found = {str(k): _plain(v, depth + 1) for k, v in value.items()}
        return {k: v for k, v in sorted(found.items()) if v is not _LEFT_OUT}
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict) and not isinstance(value, nn.Module):
        try:
            return _plain(to_dict(), depth + 1)
        except Exception:  # a to_dict that needs arguments, or fails: not plain data
            return _LEFT_OUT
    return _LEFT_OUT


def plain_attributes(module: nn.Module) -> dict[str, Any]:
    """``{"self_attn.scaling": 0.177, ...}``: the plain public attributes of ``module`` and its
    submodules, by path; an object two modules share (one config) is read once, at the first
    path that holds it."""
    found: dict[str, Any] = {}
    seen: set[int] = set()
    for path, submodule in module.named_modules():
        for name, value in vars(submodule).items():
            if name.startswith("_") or name == "training":
                continue
            if not isinstance(value, bool | int | float | str | type(None)):
                if id(value) in seen:
                    continue
                seen.add(id(value))
            plain = _plain(value)
            if plain is not _LEFT_OUT:
                found[f"{path}.{name}" if path else name] = plain
    return found


def differing_attributes(mine: dict[str, Any], other: dict[str, Any], limit: int = 3) -> str:
    """``self_attn.scaling: 0.1768 here, 0.1767 on rank 0``, for the first ``limit`` that
    differ (and how many more)."""
    names = [n for n in dict.fromkeys([*mine, *other]) if mine.get(n) != other.get(n)]
    shown = [
        f"{name}: {_short(mine.get(name))} here, {_short(other.get(name))} on rank 0"
        for name in names[:limit]
    ]
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return "; ".join(shown) + more


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
