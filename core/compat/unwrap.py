"""Unwrapping without touching the prepared model.

``extract_model_from_parallel`` hands back the plain module behind DDP, DataParallel, FSDP
(v1) or a DeepSpeed engine and, on request, a version of it without the mixed-precision
``forward`` wrapper: a copy of the root sharing its children. Where the wrapper is inside the
root's compiled code (a model compiled whole), the copy is an *uncompiled twin*, a new module
tree that shares every parameter, buffer and untouched submodule with the prepared model and
copies only the modules that carry a compiled ``forward`` (and their ancestors). The prepared
model is never modified.
"""

from __future__ import annotations

import copy
import types
import warnings
from typing import Any

from torch import nn

from torchkiln._internals.accelerate import (
    drop_fp32_wrapper_record,
    drop_orig_mod,
    fp32_wrapped_forward,
)
from torchkiln._internals.nn_module import child_modules
from torchkiln.engine.compile_state import STATE_ATTR, CompileState, RegionState, state_of

_MISSING: Any = object()
LIVE_STATUSES = ("pending", "serving", "compiled")
"""Region statuses whose ``forward`` is a compiled path (``eager``/``failed`` fell back)."""


def live_regions(state: CompileState | None) -> list[RegionState]:
    if state is None:
        return []
    return [r for r in state.regions if r.status in LIVE_STATUSES]


def shallow_module_copy(module: nn.Module) -> nn.Module:
    """A new instance of the same class sharing tensors, children and settings with
    ``module``; its own registries (parameters, buffers, children, hooks) are new dicts, so
    changing the copy never changes ``module``."""
    twin = module.__class__.__new__(module.__class__)
    for key, value in module.__dict__.items():
        twin.__dict__[key] = copy.copy(value) if isinstance(value, dict | set) else value
    twin.__dict__.pop(STATE_ATTR, None)
    drop_orig_mod(twin)
    return twin


def carry_forward(forward: Any, original: nn.Module, twin: nn.Module, path: str) -> Any:
    """``forward`` as it should be on ``twin``: rebound if it was bound to ``original``;
    ``_MISSING`` (use the class ``forward``) if it closes over ``original`` and cannot move."""
    if not callable(forward):  # no instance forward (this module's or torchkiln's sentinel)
        return _MISSING
    if isinstance(forward, types.MethodType) and forward.__self__ is original:
        if forward.__func__ is getattr(type(original), "forward", None):
            return _MISSING
        return types.MethodType(forward.__func__, twin)
    if _closes_over(forward, original):
        warnings.warn(
            f"the instance forward of {path or '<root>'} ({forward!r}) wraps the prepared "
            "module's own bound forward, so it cannot run on an uncompiled copy; the copy uses "
            "the class forward instead. Wrap forward as a method (MethodType) to keep it.",
            RuntimeWarning,
            stacklevel=4,
        )
        return _MISSING
    return forward


def _closes_over(function: Any, module: nn.Module) -> bool:
    """Whether ``function`` or a function it ``functools.wraps`` is a method of ``module``."""
    for _ in range(32):  # a chain of __wrapped__ ends in None, or is cut off here
        if getattr(function, "__self__", None) is module:
            return True
        function = getattr(function, "__wrapped__", None)
    return False


def uncompiled_twin(root: nn.Module) -> nn.Module:
    """``root`` as it was before torchkiln compiled it, as a parameter-sharing twin, minus the
    autocast wrapper."""
    state = state_of(root)
    previous: dict[int, Any] = {}
    paths: set[str] = {""}
    if state is not None:
        for region in state.regions:
            previous[id(region.region.module)] = region.previous_forward
            paths.update(_with_ancestors(region.region.path))
        for module, before in state.replaced_forwards:
            previous.setdefault(id(module), before)
        for path, module in root.named_modules(remove_duplicate=False):
            if id(module) in previous:  # nested_compile_region marks (hierarchical plans)
                paths.update(_with_ancestors(path))
    return _copy_tree(root, "", paths, previous, {})


def root_copy_without_fp32_wrapper(root: nn.Module) -> nn.Module:
    """A copy of ``root`` alone (children shared, still compiled) minus the autocast wrapper."""
    return _copy_tree(root, "", {""}, {}, {})


def _with_ancestors(path: str) -> list[str]:
    parts = path.split(".") if path else []
    return [""] + [".".join(parts[: i + 1]) for i in range(len(parts))]


def _copy_tree(
    module: nn.Module,
    path: str,
    paths: set[str],
    previous: dict[int, Any],
    memo: dict[int, nn.Module],
) -> nn.Module:
    if id(module) in memo:  # a submodule reachable twice stays one object in the twin
        return memo[id(module)]
    twin = memo[id(module)] = shallow_module_copy(module)
    for name, child in child_modules(module).items():
        child_path = f"{path}.{name}" if path else name
        if child is not None and child_path in paths:
            child_modules(twin)[name] = _copy_tree(child, child_path, paths, previous, memo)
    forward = previous.get(id(module), module.__dict__.get("forward", _MISSING))
    if not path:  # the root: without the autocast wrapper
        forward = fp32_wrapped_forward(module, forward)
        drop_fp32_wrapper_record(twin)
    forward = carry_forward(forward, module, twin, path)
    if forward is _MISSING:
        twin.__dict__.pop("forward", None)
    else:
        twin.__dict__["forward"] = forward
    return twin
