"""Accelerate's device hooks (``dispatch_model``, ``cpu_offload``, a ``device_map``) run around
each compiled block, not inside its trace.

Accelerate's ``add_hook_to_module`` makes a module's ``forward`` a wrapper that runs the hook
before and after it. Under ``cpu_offload`` every submodule with weights carries one, whose
``AlignDevicesHook`` loads the weights in a ``torch.compiler.disable`` function: traced, each
block would break into a graph per layer. Here a block's own hook (any kind) runs around its
compiled call exactly as the wrapper runs it, and so do its submodules' ``AlignDevicesHook``
(weights loaded before the call and offloaded after where the hook offloads; resident weights,
a ``device_map`` onto one device, stay put) when they all run on one device. The report says
which, per group. Any other
hook stays in the trace, and the report and a warning name it.
docs/migrating-from-accelerate.md says what differs from Accelerate.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import attrs
import torch
from torch import nn

from torchkiln._internals import accelerate
from torchkiln.plugin import (
    GroupPreparation,
    PartialCompileWarning,
    RegionGroup,
    hookimpl,
)


@attrs.frozen
class BlockHooks:
    """The Accelerate hooks one block runs around its compiled call."""

    own: bool
    """The block's own hook: its wrapper is taken off and the hook runs around the call."""
    lifted: tuple[nn.Module, ...]
    """Submodules whose ``AlignDevicesHook`` runs before and after the call, in module order."""
    kept: tuple[str, ...]
    """Hooks left in the trace, as ``"<kind> on <path>"``."""
    own_does: str = ""
    """What the block's own hook does around the call (``AlignDevicesHook: inputs moved to
    cpu``), for the report."""
    lifted_offloads: tuple[bool, ...] = ()
    """Per lifted submodule: whether its hook loads the weights before the call and offloads
    them after (``offload``); a resident one's weights stay where they are."""
    device: torch.device | None = None
    """The one execution device of the lifted hooks (``None``: none names one)."""


def _align_hook_class() -> type | None:
    """Accelerate's ``AlignDevicesHook`` if Accelerate is loaded (a hooked model loaded it)."""
    hooks = sys.modules.get("accelerate.hooks")
    return getattr(hooks, "AlignDevicesHook", None)


def _runs_class_forward(module: nn.Module) -> bool:
    """Whether the hook's wrapper calls ``module``'s class forward (not another wrapper)."""
    under = accelerate.forward_under_hook(module)
    return getattr(under, "__self__", None) is module and (
        getattr(under, "__func__", None) is type(module).forward
    )


def _device(hook: Any) -> torch.device | None:
    device = getattr(hook, "execution_device", None)
    return None if device is None else torch.device(device)


def block_hooks(block: nn.Module, align_hook: type | None, lift: bool) -> BlockHooks | None:
    """What of ``block``'s Accelerate hooks runs around its compiled call (``None``: it has no
    hook). Submodules' ``AlignDevicesHook`` are lifted only when ``lift``, all together, and
    only when they and the block's own share one execution device: inside a block nothing
    else moves the inputs between devices. Lifted, a block's weights are all loaded at once:
    the root is never lifted, which would load the whole model."""
    own_hook = accelerate.hook_of(block)
    own = own_hook is not None and _runs_class_forward(block)
    candidates: list[tuple[str, nn.Module, Any]] = []
    kept: list[tuple[str, nn.Module, Any]] = []
    for path, module in block.named_modules():
        hook: Any = accelerate.hook_of(module) if module is not block else None
        if hook is None:
            continue
        liftable = (
            lift
            and align_hook is not None
            and type(hook) is align_hook
            and not getattr(hook, "io_same_device", False)
            and _runs_class_forward(module)
        )
        (candidates if liftable else kept).append((path, module, hook))
    devices = {_device(hook) for _, _, hook in candidates}
    if own and type(own_hook) is align_hook:
        devices.add(_device(own_hook))
    devices.discard(None)  # a hook with no execution device moves nothing
    if len(devices) > 1:
        kept, candidates = kept + candidates, []
    if not own and not candidates and not kept:
        return None
    return BlockHooks(
        own=own,
        lifted=tuple(module for _, module, _ in candidates),
        kept=tuple(f"{type(hook).__name__} on {path}" for path, _, hook in kept),
        own_does=_own_does(own_hook, align_hook) if own else "",
        lifted_offloads=tuple(bool(getattr(hook, "offload", False)) for _, _, hook in candidates),
        device=next(iter(devices), None),
    )


def _own_does(hook: Any, align_hook: type | None) -> str:
    """What a block's own hook does around its call, as its ``pre_forward``/``post_forward`` do
    it: an ``AlignDevicesHook`` moves the inputs to its execution device, and loads and offloads
    the weights only when it offloads; another kind is named."""
    if align_hook is None or type(hook) is not align_hook:
        return type(hook).__name__
    device = _device(hook)
    does = [f"inputs moved to {device}"] if device is not None else []
    if getattr(hook, "io_same_device", False):
        does.append("outputs moved back")
    if getattr(hook, "offload", False):
        does.append("its weights loaded before the call, offloaded after")
    return f"AlignDevicesHook: {', '.join(does) or 'nothing moves'}"


def run_around(hooks_by_block: dict[int, BlockHooks]) -> Any:
    """``wrap_call``: each block's lifted hooks before and after its compiled call, in the
    order Accelerate's wrappers would run them (the block's own outermost)."""

    def wrap(compiled: Any) -> Any:
        def call(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            hooks = hooks_by_block.get(id(module))
            if hooks is None:
                return compiled(module, *args, **kwargs)
            own = accelerate.attached_hook(module) if hooks.own else None
            if own is not None:
                args, kwargs = own.pre_forward(module, *args, **kwargs)
            lifted = [
                (inner, hook)
                for inner in hooks.lifted
                if (hook := accelerate.attached_hook(inner)) is not None
            ]
            for inner, hook in lifted:
                hook.pre_forward(inner)
            no_grad = own is not None and own.no_grad
            with torch.no_grad() if no_grad else contextlib.nullcontext():
                output = compiled(module, *args, **kwargs)
            for inner, hook in reversed(lifted):
                hook.post_forward(inner, None)
            return own.post_forward(module, output) if own is not None else output

        return call

    return wrap


def _own_note(found: Sequence[BlockHooks], blocks: int) -> str:
    """``the block's own hook (2 of 2 blocks, AlignDevicesHook: inputs moved to cpu)``."""
    owners = [hooks.own_does for hooks in found if hooks.own]
    if not owners:
        return ""
    kinds = dict.fromkeys(owners)
    if len(kinds) == 1:
        return f"the block's own hook ({len(owners)} of {blocks} blocks, {owners[0]})"
    each = "; ".join(f"{owners.count(kind)} blocks, {kind}" for kind in kinds)
    return f"the block's own hook ({len(owners)} of {blocks} blocks: {each})"


def _lifted_note(hooks: BlockHooks) -> str:
    """What one block's lifted ``AlignDevicesHook`` do: load and offload its weights (those
    that offload), or move nothing (weights resident on their device)."""
    count, offloaded = len(hooks.lifted), sum(hooks.lifted_offloads)
    where = f"on {hooks.device}" if hooks.device is not None else "where they are"
    if offloaded == count:
        does = "weights loaded before the call, offloaded after"
    elif offloaded == 0:
        does = f"weights stay {where}: nothing loaded or offloaded"
    else:
        does = (
            f"{offloaded} offloaded: weights loaded before the call, offloaded after; "
            f"{count - offloaded} resident {where}: nothing moves"
        )
    return f"AlignDevicesHook of {count} submodules a block ({does})"


def _notes(found: Sequence[BlockHooks], blocks: int) -> list[str]:
    """The report's lines for a group: what runs around its calls, what stays in the trace."""
    around = [_own_note(found, blocks)]
    around += dict.fromkeys(_lifted_note(hooks) for hooks in found if hooks.lifted)
    around = [part for part in around if part]
    notes = [f"Accelerate hooks run around each compiled call: {'; '.join(around)}"] * bool(around)
    kept = sorted({line for hooks in found for line in hooks.kept})
    if kept:
        more = f" and {len(kept) - 3} more" if len(kept) > 3 else ""
        notes.append(f"Accelerate hooks traced with the block: {', '.join(kept[:3])}{more}")
    return notes


@hookimpl(tryfirst=True)  # outermost, as Accelerate's wrapper is
def prepare_group(group: RegionGroup) -> GroupPreparation | None:
    """Take Accelerate's hook wrappers off the group's blocks and lifted submodules, and run
    their hooks around the compiled call (see the module doc)."""
    align_hook = _align_hook_class()
    hooks_by_block: dict[int, BlockHooks] = {}
    forwards: list[tuple[nn.Module, None]] = []
    for region in group.regions:
        hooks = block_hooks(region.module, align_hook, lift=region.path != "")
        if hooks is not None:
            hooks_by_block[id(region.module)] = hooks
            forwards += [(region.module, None)] * hooks.own
            forwards += [(inner, None) for inner in hooks.lifted]
    if not hooks_by_block:
        return None
    notes = _notes(list(hooks_by_block.values()), len(group.regions))
    if any(hooks.kept for hooks in hooks_by_block.values()):
        warnings.warn(
            f"group {group.name!r}: {notes[-1]}; Dynamo traces them, which may break the "
            "block's graph (each kind is named in torchkiln.report)",
            PartialCompileWarning,
            stacklevel=2,
        )
    return GroupPreparation(
        wrap_call=run_around(hooks_by_block), forwards=tuple(forwards), notes=tuple(notes)
    )
