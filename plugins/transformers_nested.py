"""Built-in plugin: side-effect-free nested blocks for transformers decoder layers
(``regions="hierarchical"``).

Dynamo reuses a nested block's trace at the other call sites only when the block has no side
effects that outlive it, and a decoder layer's ``cache.update(...)`` writes the cache layer,
so every block is traced again. This plugin splits each block call in two: an *outer* step, in
the whole-model graph, reads the layer's cached keys and values, calls the *nested* step and
writes back the keys and values it returns; the nested step runs the block's own ``forward``
with a :class:`NestedLayerCache` created inside it, so nothing outside changes and its trace
is reused. A block it cannot handle runs as under the ``hierarchical`` plugin alone, with one
warning. docs/hierarchical.md says which caches are handled and how the two plugins combine.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import attrs
import torch
from torch import nn

from torchkiln._internals import dynamo
from torchkiln.plugin import (
    GroupPreparation,
    PartialCompileWarning,
    RegionGroup,
    RegionPlan,
    hookimpl,
)
from torchkiln.plugins.hierarchical import NAME as HIERARCHICAL
from torchkiln.plugins.transformers_models import (
    TRANSFORMERS_CACHE,
    cache_parameter,
    is_transformers_module,
    unrouted_forwards,
)


def layer_index_owner(block: nn.Module) -> nn.Module | None:
    """The submodule whose ``layer_idx`` is ``block``'s index into the cache, if unambiguous.

    ``None`` when no submodule carries an integer ``layer_idx``, or when they disagree.
    """
    owners = [
        module
        for module in block.modules()
        if isinstance(getattr(module, "layer_idx", None), int)
        and not isinstance(module.layer_idx, bool)
    ]
    if not owners or len({owner.layer_idx for owner in owners}) != 1:
        return None
    return owners[0]


class NestedLayerCache:
    """One layer's KV cache inside a nested block call: created by the nested step itself, so
    updating it is no side effect outside the step.

    ``update`` does what ``DynamicLayer.update`` does (concatenate along the sequence
    dimension, return the whole keys and values) and keeps the result for the outer step to
    write into the real cache layer.
    """

    def __init__(self, keys: torch.Tensor | None, values: torch.Tensor | None):
        self.keys = keys
        self.values = values
        self.updated = False

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # torch.cat also in prefill: DynamicLayer concatenates onto an empty tensor, which gives
        # a fresh contiguous copy; the same here, so attention sees the same layout as eager.
        past_keys = () if self.keys is None else (self.keys,)
        past_values = () if self.values is None else (self.values,)
        self.keys = torch.cat([*past_keys, key_states], dim=-2)
        self.values = torch.cat([*past_values, value_states], dim=-2)
        self.updated = True
        return self.keys, self.values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"torchkiln's nested cache view (plugin torchkiln.transformers_nested) has no "
            f"{name!r}: it answers update and get_seq_length only. Disable the plugin "
            "torchkiln.transformers_nested to run this block with the real cache."
        )


def flatten_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, list[Any]]:
    """``(spec, leaves)``: a block call's arguments as one flat list and a string saying how
    to rebuild them (:func:`unflatten_call`).

    Why: torch builds a reuse fingerprint of a nested region's arguments on every call site,
    by tracing ``pytree.tree_flatten`` unless the arguments are already flat leaves with no
    keywords; that generic flatten cost about as much as the rest of a reused call. Tuples and
    lists (the position embeddings) are unpacked one level; anything else is one leaf (a
    nested container stays whole: torch then takes its slower path, still correct).
    """
    parts = []
    leaves: list[Any] = []
    for name, value in (*(("", value) for value in args), *kwargs.items()):
        kind = "t" if type(value) is tuple else "l" if type(value) is list else ""
        if kind:
            parts.append(f"{name}:{kind}{len(value)}")
            leaves.extend(value)
        else:
            parts.append(f"{name}:")
            leaves.append(value)
    return ",".join(parts), leaves


def unflatten_call(spec: str, leaves: tuple[Any, ...]) -> tuple[list[Any], dict[str, Any]]:
    """The ``(args, kwargs)`` that :func:`flatten_call` flattened into ``spec`` and ``leaves``."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    index = 0
    for part in spec.split(",") if spec else ():
        name, kind = part.split(":")
        if kind:
            count = int(kind[1:])
            items = leaves[index : index + count]
            value: Any = tuple(items) if kind[0] == "t" else list(items)
            index += count
        else:
            value = leaves[index]
            index += 1
        if name:
            kwargs[name] = value
        else:
            args.append(value)
    return args, kwargs


def nested_step(forward: Callable[..., Any]) -> Callable[..., Any]:
    """The pure step for one block class's ``forward``, marked with ``nested_compile_region``.

    ``step(block, slot, spec, past_keys, past_values, *leaves)`` rebuilds the block's
    arguments (:func:`unflatten_call`), runs ``forward`` with a :class:`NestedLayerCache` put
    at ``slot`` (a position or a keyword) and returns ``(output, keys, values)``, or
    ``(output,)`` when the block did not update the cache. Every argument is a leaf (a tensor,
    a constant, the block), so torch fingerprints the call cheaply.
    """

    def run_with_local_cache(
        block: nn.Module,
        slot: int | str,
        spec: str,
        past_keys: torch.Tensor | None,
        past_values: torch.Tensor | None,
        *leaves: Any,
    ) -> tuple[Any, ...]:
        view = NestedLayerCache(past_keys, past_values)
        args, kwargs = unflatten_call(spec, leaves)
        if isinstance(slot, int):
            args[slot] = view
        else:
            kwargs[slot] = view
        output = forward(block, *args, **kwargs)
        if not view.updated:
            return (output,)
        return output, view.keys, view.values

    run_with_local_cache.__qualname__ = f"{getattr(forward, '__qualname__', 'forward')}.nested"
    return torch.compiler.nested_compile_region(run_with_local_cache)


@attrs.define(eq=False)
class NestedBlocks:
    """Per nested group: how each block's call is split (see the module doc)."""

    group: str
    parameter: str
    position: int | None
    cache_class: Any
    """transformers' ``Cache`` (typed ``Any``: transformers is imported lazily)."""
    layer_class: Any
    """transformers' ``DynamicLayer``: the one layer kind the nested view reproduces."""
    plain: Callable[..., Any]
    """The block class's ``forward`` marked as is (the real cache goes in): the fallback."""
    step: Callable[..., Any]
    """:func:`nested_step` of the block class's ``forward``."""

    def forward(self, owner: Any, block: nn.Module, *args: Any, **kwargs: Any) -> Any:
        """The block's call, split into outer (traced inline) and nested (pure) steps.

        ``owner`` is the submodule whose ``layer_idx`` is the block's index into the cache.
        """
        slot, cache = self._find_cache(args, kwargs)
        if cache is None:
            return self.plain(block, *args, **kwargs)
        layer, reason = self._layer(owner.layer_idx, cache)
        if layer is None:
            self._note(reason)
            return self.plain(block, *args, **kwargs)
        if isinstance(slot, int):
            args = (*args[:slot], None, *args[slot + 1 :])
        else:
            kwargs = {**kwargs, slot: None}
        has_past = layer.is_initialized and layer.keys.numel() > 0
        past = (layer.keys, layer.values) if has_past else (None, None)
        spec, leaves = flatten_call(args, kwargs)
        result = self.step(block, slot, spec, *past, *leaves)
        if len(result) == 3:
            _, keys, values = result
            if not layer.is_initialized:
                layer.lazy_initialization(keys, values)
            layer.keys, layer.values = keys, values
        return result[0]

    def _find_cache(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
        if self.position is not None and len(args) > self.position:
            return self.position, args[self.position]
        for key in (
            (self.parameter, "past_key_values") if self.parameter == "cache" else (self.parameter,)
        ):
            if kwargs.get(key) is not None:
                return key, kwargs[key]
        return None, None

    def _layer(self, index: int, cache: Any) -> tuple[Any, str]:
        """Layer ``index`` of ``cache`` if it is a ``DynamicLayer``, else ``None`` and why."""
        name = type(cache).__name__
        if not isinstance(cache, self.cache_class):
            return None, f"{name} is not a transformers Cache"
        if type(cache).update is not self.cache_class.update:
            return None, f"{name} overrides Cache.update"
        if getattr(cache, "offloading", False):
            return None, f"{name} offloads layers (offloading=True)"
        layers = getattr(cache, "layers", None)
        if not isinstance(layers, list):
            return None, f"{name} has no per-layer list"
        if len(layers) <= index and getattr(cache, "layer_class_to_replicate", None) is not None:
            while len(layers) <= index:  # what Cache.update would do first
                layers.append(cache.layer_class_to_replicate())
        if len(layers) <= index:
            return None, f"{name} has no layer {index}"
        layer = layers[index]
        if type(layer) is not self.layer_class:
            return None, f"{name} holds a {type(layer).__name__}, not a DynamicLayer"
        return layer, ""

    def _note(self, reason: str) -> None:
        """Warn once per group and reason (:class:`~torchkiln.plugin.PartialCompileWarning`): at trace time under Dynamo (no graph
        break, nothing in the graph), else right away."""
        message = (
            f"torchkiln: transformers nested blocks: group {self.group!r}: {reason}, so the "
            "block runs with the real cache and Dynamo traces it at every call site "
            "(see docs/hierarchical.md)"
        )
        dynamo.comptime_function()(_say_while_tracing, lambda: _say(message))


_SAID: set[str] = set()
"""Messages already printed (each is said once per process)."""


def _say(message: str) -> None:
    if message not in _SAID:
        _SAID.add(message)
        warnings.warn(message, PartialCompileWarning, stacklevel=2)


def _say_while_tracing(ctx: Any) -> None:
    # runs for real while Dynamo traces _note; the message is a constant of that trace
    _say(ctx.get_local("message").as_python_constant())


def nested_blocks(group: RegionGroup) -> NestedBlocks | None:
    """The split for ``group``'s blocks, or ``None`` when they are not transformers decoder
    layers (a cache parameter and one integer ``layer_idx`` each)."""
    blocks = [region.module for region in group.regions]
    if not blocks or not is_transformers_module(blocks[0]):
        return None
    if len({type(block) for block in blocks}) != 1:
        return None
    parameter = cache_parameter(blocks[0], TRANSFORMERS_CACHE.cache_parameters)
    owners = [layer_index_owner(block) for block in blocks]
    if parameter is None or any(owner is None for owner in owners):
        return None
    from transformers.cache_utils import Cache, DynamicLayer

    forward = type(blocks[0]).forward
    plain = torch.compiler.nested_compile_region(forward)
    return NestedBlocks(group.name, *parameter, Cache, DynamicLayer, plain, nested_step(forward))


@hookimpl(trylast=True)
def prepare_group(plan: RegionPlan, group: RegionGroup) -> GroupPreparation | None:
    """Hierarchical plans: install the split forward on transformers decoder layers.

    Runs after the ``hierarchical`` plugin's ``prepare_group`` (``trylast``), so the forward it
    installs replaces the plain marked one on the blocks it handles; other blocks keep it.
    """
    if plan.selector != HIERARCHICAL or not group.nested:
        return None
    forwards: list[tuple[nn.Module, Callable[..., Any]]] = []
    for nested_group in group.nested:
        split = nested_blocks(nested_group)
        if split is None:
            continue
        for region in nested_group.regions:
            # a partial, as the hierarchical plugin does (a bound method reuses the nested
            # subgraph with the previous block's weights in torch 2.13)
            owner = layer_index_owner(region.module)
            forward = functools.partial(split.forward, owner, region.module)
            forwards.append((region.module, forward))
            forwards.extend(unrouted_forwards(region.module))
    return GroupPreparation(forwards=tuple(forwards)) if forwards else None
