"""Built-in plugin: the model adapter for transformers models (KV caches, output capture).

A transformers decoder layer calls ``cache.update(keys, values, self.layer_idx)``, and
``Cache.update`` indexes its Python list of per-layer caches with that index. Dynamo
specialises a list index, so every layer's trace guards on a different slot
(``cache.layers[3].is_initialized``): block 2 recompiles, and so does every block after it
until Dynamo's recompile limit (8), after which the remaining layers run eagerly.

This adapter hands each compiled block a :class:`LayerCache` instead of the whole cache: a
small object built *outside* the compiled code, in the eager call of the block, that holds
the one per-layer cache the block owns. Its ``update`` goes straight to that layer, so the
traced code never indexes the list; every block of a class sees the same kind of object in
the same state (prefill: empty; decode: filled), and one graph serves every depth. Anything
else a block asks of the cache (``get_seq_length``, ``is_sliding``, ...) is answered by the
whole cache, exactly as before.

The adapter also runs each block with transformers' output collector
(``CompileableContextVar``, used by ``output_hidden_states`` / ``output_attentions``) in its
compile-friendly mode: a ``ContextVar`` cannot be traced, so otherwise every block with a
capture hook inside (the attention module's) breaks its graph on every call.

Which caches are split per layer: any ``transformers.Cache`` whose class keeps
``Cache.update`` (it dispatches to ``self.layers[layer_idx].update``, as ``DynamicCache``,
``StaticCache`` and ``QuantizedCache`` do) and that does not offload. Any other ``Cache``
(one that overrides ``update``, or offloads) gets an :class:`OpaqueCacheUpdate` view: its
``update`` runs outside the graph (``torch.compiler.disable``), which costs a graph break per
block call but keeps the number of graphs independent of depth; the adapter says so once per
group on stderr (``torchkiln: transformers adapter: ...``) and the report counts the breaks.
An ``EncoderDecoderCache`` (T5, BART, Pegasus, Whisper) gets an ``EncoderDecoderCache``
subclass view whose two halves are the layer's :class:`LayerCache` views and whose
``is_updated`` is a :class:`LayerFlags` (copied back after the block); when a half cannot be
split the whole cache is passed through, said once on stderr. Objects that are not a
``transformers.Cache`` (a plugin's own view, say) are passed through untouched. docs/generation.md says how a plugin adds support for another cache.

Groups are adapted when their blocks are transformers classes with a cache parameter
(``cache``, ``past_key_values``, ``layer_past``) and exactly one integer ``layer_idx`` among
their submodules (a decoder layer): a whole-model region (``whole``, ``hierarchical``) is left
alone.

transformers is imported only when a model's block is a transformers class (checked by the
class's module name, without importing anything).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import torch
from torch import nn

from torchkiln.plugin import CompileConfig, GroupPreparation, RegionGroup, RegionPlan, hookimpl

MARK_LAYER_INDEX_DYNAMIC = True
"""Trace every ``layer_idx`` as symbolic from the first compile (see :data:`LAYER_INDEX_SOURCE`)."""
LAYER_INDEX_SOURCE = r".*\.layer_idx$"
"""``torch.compiler.config.dynamic_sources`` entry set while Dynamo may trace a block: the block
reads its ``layer_idx`` to pass it to the cache, and Dynamo would first specialise it (a guard
``layer_idx == 0``) and only then recompile with it symbolic: two graphs where one does. Set
through ``GroupPreparation.trace_settings``, so calls that run compiled code do not pay it."""
compiler_config = torch.compiler.config


@contextlib.contextmanager
def layer_index_dynamic() -> Iterator[None]:
    """:data:`LAYER_INDEX_SOURCE` added to ``torch.compiler.config.dynamic_sources``, then
    the previous value restored."""
    sources = compiler_config.dynamic_sources
    compiler_config.dynamic_sources = f"{sources},{LAYER_INDEX_SOURCE}"
    try:
        yield
    finally:
        compiler_config.dynamic_sources = sources


CACHE_PARAMETERS = ("cache", "past_key_values", "past_key_value", "layer_past")
"""Names transformers decoder layers give their cache parameter (``cache`` since 5.x)."""


def is_transformers_module(module: nn.Module) -> bool:
    """Whether ``module``'s class (or a base class) comes from transformers; imports nothing."""
    return (
        any(cls.__module__.split(".", 1)[0] == "transformers" for cls in type(module).__mro__)
        and "transformers" in sys.modules
    )


class LayerCache:
    """One layer's view of a transformers ``Cache``, handed to a compiled block.

    ``update(keys, values, layer_idx, ...)`` stores into the layer this view was built for when
    ``layer_idx`` is the block's own index; the comparison is between the block's own
    ``layer_idx`` and the one it passes, both read by the trace from the same module
    attribute, so it is decided while tracing and leaves no per-layer guard. Any other index
    (a block that writes another layer's slot) goes to the whole cache, as it always did.
    Everything else is the whole cache's answer.
    """

    def __init__(self, cache: Any, layer: Any, owner: nn.Module):
        self._torchkiln_cache = cache
        self._torchkiln_layer = layer
        self._torchkiln_owner = owner

    def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any):
        if layer_idx == self._torchkiln_owner.layer_idx:
            return self._torchkiln_layer.update(key_states, value_states, *args, **kwargs)
        return self._torchkiln_cache.update(key_states, value_states, layer_idx, *args, **kwargs)

    def get_seq_length(self, layer_idx: int = 0) -> Any:
        # T5's attention asks for its own layer's length; the whole cache would index its list.
        # (A linear-attention layer has no length: the whole cache answers, as it always did.)
        layer = self._torchkiln_layer
        if layer_idx == self._torchkiln_owner.layer_idx and hasattr(layer, "get_seq_length"):
            return layer.get_seq_length()
        return self._torchkiln_cache.get_seq_length(layer_idx)

    @property
    def layers(self) -> LayerList:
        """``cache.layers[layer_idx]`` (cross-attention reuses its stored keys this way) gives
        this layer's slot without indexing the list in the trace."""
        return LayerList(self._torchkiln_cache, self._torchkiln_layer, self._torchkiln_owner)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names this class does not define: the whole cache answers. Its own
        # fields are missing only while unpickling (torch's saved guards): no recursion then.
        if name.startswith("_torchkiln_"):
            raise AttributeError(name)
        return getattr(self._torchkiln_cache, name)

    def __repr__(self) -> str:
        return f"LayerCache({self._torchkiln_cache!r}, layer {self._torchkiln_owner.layer_idx})"


class LayerList:
    """A cache's ``layers`` as one layer sees it: its own index gives its own slot (decided
    while tracing, as in :meth:`LayerCache.update`); any other index the whole list's."""

    def __init__(self, cache: Any, layer: Any, owner: nn.Module):
        self._torchkiln_cache = cache
        self._torchkiln_layer = layer
        self._torchkiln_owner = owner

    def __getitem__(self, index: Any) -> Any:
        if index == self._torchkiln_owner.layer_idx:
            return self._torchkiln_layer
        return self._torchkiln_cache.layers[index]


class LayerFlags:
    """An ``EncoderDecoderCache.is_updated`` dict as one layer sees it.

    ``is_updated[layer_idx]`` (and ``.get``) with the block's own index reads and writes a
    flag on this object, copied from the whole dict before the block runs and back after it
    (:meth:`BlockAdapter.wrap_call`), so the trace neither looks a key up in the dict nor
    writes one (both would specialise on the index). Any other index: the whole dict.
    """

    def __init__(self, flags: dict[Any, Any], owner: nn.Module):
        self._torchkiln_flags = flags
        self._torchkiln_owner = owner
        self._torchkiln_value = bool(flags.get(owner.layer_idx, False))

    def get(self, index: Any, default: Any = None) -> Any:
        if index == self._torchkiln_owner.layer_idx:
            return self._torchkiln_value
        return self._torchkiln_flags.get(index, default)

    def __getitem__(self, index: Any) -> Any:
        if index == self._torchkiln_owner.layer_idx:
            return self._torchkiln_value
        return self._torchkiln_flags[index]

    def __setitem__(self, index: Any, value: Any) -> None:
        if index == self._torchkiln_owner.layer_idx:
            self._torchkiln_value = value
        else:
            self._torchkiln_flags[index] = value

    def write_back(self) -> None:
        """Copy this layer's flag into the whole dict (eager, after the block)."""
        self._torchkiln_flags[self._torchkiln_owner.layer_idx] = bool(self._torchkiln_value)


def _update_whole_cache(
    cache: Any, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any
) -> Any:
    return cache.update(key_states, value_states, layer_idx, *args, **kwargs)


_opaque_update = torch.compiler.disable(_update_whole_cache)


class OpaqueCacheUpdate:
    """A view of a cache the adapter cannot split per layer: ``update`` runs eagerly, outside
    the graph (a graph break), so the list index it uses is never traced or guarded."""

    def __init__(self, cache: Any):
        self._torchkiln_cache = cache

    def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any):
        return _opaque_update(
            self._torchkiln_cache, key_states, value_states, layer_idx, *args, **kwargs
        )

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_torchkiln_"):  # missing only while unpickling: no recursion
            raise AttributeError(name)
        return getattr(self._torchkiln_cache, name)

    def __repr__(self) -> str:
        return f"OpaqueCacheUpdate({self._torchkiln_cache!r})"


@functools.cache
def encoder_decoder_view_class(base: type) -> type:
    """A subclass of transformers' ``EncoderDecoderCache`` (``base``; the models check
    ``isinstance``) for one layer's view: both halves are that layer's :class:`LayerCache`
    and ``is_updated`` its :class:`LayerFlags`. Anything else is the whole cache's answer."""

    class EncoderDecoderLayerCache(base):  # type: ignore[misc, valid-type]
        def __init__(self, cache: Any, own: LayerCache, cross: LayerCache, flags: LayerFlags):
            # Not base.__init__: it would build new halves; these are the layer's views.
            self._torchkiln_cache = cache
            self.self_attention_cache = own
            self.cross_attention_cache = cross
            self.is_updated = flags

        def __getattr__(self, name: str) -> Any:
            if name.startswith("_torchkiln_"):  # missing only while unpickling
                raise AttributeError(name)
            return getattr(self._torchkiln_cache, name)

        def __repr__(self) -> str:
            owner = self.is_updated._torchkiln_owner
            return f"EncoderDecoderLayerCache({self._torchkiln_cache!r}, layer {owner.layer_idx})"

    return EncoderDecoderLayerCache


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


def cache_parameter(block: nn.Module) -> tuple[str, int | None] | None:
    """``(name, position)`` of the block's cache parameter (position ``None``: keyword only)."""
    try:
        parameters = list(inspect.signature(type(block).forward).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    for position, parameter in enumerate(parameters):
        if parameter.name in CACHE_PARAMETERS:
            positional = parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
            return parameter.name, position if positional else None
    return None


def unsupported_reason(cache: Any, cache_class: Any) -> str | None:
    """Why ``cache`` (a transformers ``Cache``) cannot be split per layer, or ``None``."""
    if type(cache).update is not cache_class.update:
        return f"{type(cache).__name__} overrides Cache.update"
    if getattr(cache, "offloading", False):
        return f"{type(cache).__name__} offloads layers (offloading=True)"
    return None


@attrs.define(eq=False)
class BlockAdapter:
    """Per group: how to find each block's cache argument and its slot."""

    group: str
    parameter: str
    position: int | None
    cache_class: Any
    """transformers' ``Cache`` class (typed ``Any``: transformers is imported lazily)."""
    collector: Any
    """transformers' output collector (``CompileableContextVar``)."""
    owners: weakref.WeakKeyDictionary[nn.Module, nn.Module | None] = attrs.Factory(
        weakref.WeakKeyDictionary
    )
    notes: dict[str, str] = attrs.Factory(dict)
    """Reasons a cache was passed through whole, by cache class name (reported once each)."""

    encoder_decoder_class: Any = None
    """transformers' ``EncoderDecoderCache`` (``None``: not split, passed through whole)."""
    encoder_decoder_view: Any = None
    """Its per-layer view class (:func:`encoder_decoder_view_class`)."""

    def layer_view(self, block: nn.Module, cache: Any) -> Any:
        """The object the compiled block receives instead of ``cache``."""
        if not isinstance(cache, self.cache_class):
            return cache  # not a transformers cache (a plugin's own view, say): not ours
        owner = self._owner(block)
        if self.encoder_decoder_class is not None and isinstance(cache, self.encoder_decoder_class):
            return self._encoder_decoder_view(block, owner, cache)
        if not hasattr(cache, "layers"):
            self._note(
                type(cache).__name__,
                f"{type(cache).__name__} has no per-layer list",
                "so it is passed through whole (each layer may compile its own graph; see "
                "docs/generation.md)",
            )
            return cache
        reason = self._unsplittable(block, owner, cache)
        if reason is None:
            return LayerCache(cache, cache.layers[owner.layer_idx], owner)
        self._note(type(cache).__name__, reason)
        return OpaqueCacheUpdate(cache)

    def _owner(self, block: nn.Module) -> Any:
        owner: Any = self.owners.get(block, False)
        if owner is False:
            owner = self.owners[block] = layer_index_owner(block)
        return owner

    def _unsplittable(self, block: nn.Module, owner: Any, cache: Any) -> str | None:
        """Why ``cache`` cannot be split for ``block``, or ``None`` (then its slot exists)."""
        reason = unsupported_reason(cache, self.cache_class)
        if reason is None and owner is None:
            reason = f"{type(block).__name__} has no single integer layer_idx"
        if reason is not None:
            return reason
        if not hasattr(cache, "layers"):
            return f"{type(cache).__name__} has no per-layer list"
        layers = cache.layers
        index = owner.layer_idx
        if len(layers) <= index and getattr(cache, "layer_class_to_replicate", None) is not None:
            # What Cache.update would do first; done here so the slot exists to hand over.
            while len(layers) <= index:
                layers.append(cache.layer_class_to_replicate())
        if len(layers) <= index:
            return f"{type(cache).__name__} has no layer {index}"
        return None

    def _encoder_decoder_view(self, block: nn.Module, owner: Any, cache: Any) -> Any:
        """The block's view of an ``EncoderDecoderCache``: both halves split per layer and its
        ``is_updated`` flags seen through :class:`LayerFlags`; passed through whole (said once
        on stderr) when either half cannot be split."""
        halves = (cache.self_attention_cache, cache.cross_attention_cache)
        for half in halves:
            reason = self._unsplittable(block, owner, half)
            if reason is not None:
                self._note(
                    type(cache).__name__,
                    f"{type(cache).__name__} holds a cache that cannot be split ({reason})",
                    "so it is passed through whole (each layer may compile its own graph; see "
                    "docs/generation.md)",
                )
                return cache
        own, cross = (LayerCache(half, half.layers[owner.layer_idx], owner) for half in halves)
        return self.encoder_decoder_view(cache, own, cross, LayerFlags(cache.is_updated, owner))

    def _note(
        self,
        key: str,
        reason: str,
        consequence: str = "so the cache update runs outside the compiled graph (one graph "
        "break per block call; see docs/generation.md)",
    ) -> None:
        if key in self.notes:
            return
        self.notes[key] = reason
        print(
            f"torchkiln: transformers adapter: group {self.group!r}: {reason}, {consequence}",
            file=sys.stderr,
        )

    def wrap_call(self, compiled: Callable[..., Any]) -> Callable[..., Any]:
        """``compiled(module, *args, **kwargs)`` with the cache argument replaced by the block's
        :class:`LayerCache` and the output collector in its compile-friendly mode."""
        name, position, collector = self.parameter, self.position, self.collector
        layer_view = self.layer_view
        encoder_decoder_view = self.encoder_decoder_view

        def call(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            view = None
            if position is not None and len(args) > position:
                cache = args[position]
                if cache is not None:
                    view = layer_view(module, cache)
                    args = (*args[:position], view, *args[position + 1 :])
            else:
                for key in (name, "past_key_values") if name == "cache" else (name,):
                    cache = kwargs.get(key)
                    if cache is not None:
                        view = kwargs[key] = layer_view(module, cache)
            if encoder_decoder_view is None or not isinstance(view, encoder_decoder_view):
                return run(module, args, kwargs)
            try:
                return run(module, args, kwargs)
            finally:
                view.is_updated.write_back()  # the layer's flag, set in the trace

        def run(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if collector.compiling:  # already in that mode (an outer torch.compile)
                return compiled(module, *args, **kwargs)
            # ContextVar.get cannot be traced; the collector's global mode can (transformers
            # uses it under torch.compile). Set for this block's call only, then restored.
            collected = collector.context_var.get()
            own = block_outputs(collected)
            collector.global_var = own
            collector.compiling = True
            try:
                output = compiled(module, *args, **kwargs)
            finally:
                collector.global_var = None
                collector.compiling = False
            if own is not collected and collected is not None and own is not None:
                merge_block_outputs(collected, own)
            return output

        call.__name__ = call.__qualname__ = getattr(compiled, "__name__", "call")
        return call


def block_outputs(collected: dict[str, Any] | None) -> dict[str, Any] | None:
    """What capture hooks inside one block append to: fresh lists, merged back afterwards.

    Capture hooks inside a block (the attention module's, for ``output_attentions``) append
    to the collector's lists; traced, Dynamo guards on their length, which grows by one per
    layer, so each layer would compile its own graph. Each block gets empty lists instead.
    ``hidden_states`` stays shared: its hook looks at the list's length to number layers.
    """
    if not collected:
        return collected
    return {
        key: [] if key != "hidden_states" and isinstance(value, list) else value
        for key, value in collected.items()
    }


def merge_block_outputs(collected: dict[str, Any], own: dict[str, Any]) -> None:
    for key, value in own.items():
        if value is not collected[key]:
            collected[key].extend(value)


def block_adapter(group_name: str, blocks: list[nn.Module]) -> BlockAdapter | None:
    """The adapter for a group of ``blocks``, or ``None`` when they are not decoder layers of a
    transformers model (no cache parameter, no single ``layer_idx``)."""
    if not blocks or not is_transformers_module(blocks[0]):
        return None
    parameter = cache_parameter(blocks[0])
    owners = [layer_index_owner(block) for block in blocks]
    if parameter is None or any(owner is None for owner in owners):
        return None
    from transformers import cache_utils
    from transformers.cache_utils import Cache
    from transformers.utils.output_capturing import _active_collector

    adapter = BlockAdapter(group_name, parameter[0], parameter[1], Cache, _active_collector)
    encoder_decoder = getattr(cache_utils, "EncoderDecoderCache", None)
    if encoder_decoder is not None:
        adapter.encoder_decoder_class = encoder_decoder
        adapter.encoder_decoder_view = encoder_decoder_view_class(encoder_decoder)
    for block, owner in zip(blocks, owners, strict=True):
        adapter.owners[block] = owner
    return adapter


@hookimpl
def prepare_group(
    model: nn.Module, plan: RegionPlan, group: RegionGroup, config: CompileConfig
) -> GroupPreparation | None:
    """Decoder layers of transformers models get their own layer's cache (see the module doc).

    The cost on the forward path is one eager Python call per block call (find the cache
    argument, build a small view object); docs/generation.md measures it.
    """
    blocks = [model.get_submodule(region.path) for region in group.regions]
    adapter = block_adapter(group.name, blocks)
    if adapter is None:
        return None
    return GroupPreparation(
        wrap_call=adapter.wrap_call,
        trace_settings=layer_index_dynamic if MARK_LAYER_INDEX_DYNAMIC else None,
    )
