"""Built-in plugin: the cache adapter for models that keep a cache per layer (transformers'
KV and state-space caches, and any cache a plugin declares), plus transformers' output capture.

A decoder layer indexes the cache's per-layer list with its ``layer_idx``; Dynamo specialises
a list index, so every block would recompile until the recompile limit. Each compiled block is
handed a per-layer view of the cache instead (:mod:`torchkiln.plugins.layer_cache_views`),
built eagerly in the block's call, so one graph serves every depth. Caches are described by
:class:`~torchkiln.plugin.LayerCacheSpec` declarations; this plugin declares transformers'
``Cache``. Overriding or offloading caches, ``EncoderDecoderCache`` and transformers' output
collector (run in its traceable mode for each block's call) are handled as docs/generation.md
says. A whole-model region is left alone; transformers is imported only when its cache module
already is.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs
import torch
from torch import nn

from torchkiln._internals.fsdp import activation_wrapped
from torchkiln._internals.hub_kernels import unrouted_forward
from torchkiln._internals.transformers import active_collector, call_collecting_per_block
from torchkiln.plugin import (
    CompileConfig,
    GroupPreparation,
    LayerCacheSpec,
    PartialCompileWarning,
    RegionGroup,
    RegionPlan,
    hookimpl,
)
from torchkiln.plugins.layer_cache_views import (
    LayerFlags,
    LayerIndex,
    LayerView,
    ResolvedSpec,
    encoder_decoder_view_class,
    find_layer_indices,
    overridden,
    resolve,
    view_class,
    with_subclasses,
)

compiler_config = torch.compiler.config


@contextlib.contextmanager
def layer_index_dynamic(names: Sequence[str]) -> Iterator[None]:
    """The attributes ``names`` added to ``torch.compiler.config.dynamic_sources`` while Dynamo
    may trace a block, then the previous value restored: the block reads its index
    (``layer_idx``, ``layer_id``...) to pass it to the cache, and Dynamo would first specialise
    it (a guard ``layer_idx == 0``) and only then recompile with it symbolic: two graphs where
    one does. Set through ``GroupPreparation.trace_settings``: entered while Dynamo compiles
    the block's group, so calls that run compiled code do not pay it."""
    sources = compiler_config.dynamic_sources
    compiler_config.dynamic_sources = sources + r",.*\.(?:" + "|".join(names) + r")$"
    try:
        yield
    finally:
        compiler_config.dynamic_sources = sources


def is_transformers_module(module: nn.Module) -> bool:
    """Whether ``module``'s class (or a base class) comes from transformers; imports nothing."""
    return (
        any(cls.__module__.split(".", 1)[0] == "transformers" for cls in type(module).__mro__)
        and "transformers" in sys.modules
    )


PASSED_WHOLE = (
    "so it is passed through whole (each layer may compile its own graph; see docs/generation.md)"
)
RUN_OUTSIDE = (
    "so those calls run outside the compiled graph (one graph break per call; see "
    "docs/generation.md)"
)
"""What follows a cache's reason in :meth:`BlockAdapter._note`'s warning."""


def cache_parameter(block: nn.Module, names: Sequence[str]) -> tuple[str, int | None] | None:
    """``(name, position)`` of the block's cache parameter, the first of its ``forward``'s
    parameters named in ``names`` (position ``None``: keyword only); for a block in an
    activation wrapper, the wrapped block's (:func:`activation_wrapped`)."""
    block = activation_wrapped(block)
    try:
        parameters = list(inspect.signature(type(block).forward).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    for position, parameter in enumerate(parameters):
        if parameter.name in names:
            positional = parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
            return parameter.name, position if positional else None
    return None


@attrs.define(eq=False)
class BlockAdapter:
    """Per group: how to find each block's cache argument, the declaration that applies to
    it, and the block's entry."""

    group: str
    parameter: str
    position: int | None
    specs: tuple[ResolvedSpec, ...]
    indices: weakref.WeakKeyDictionary[nn.Module, LayerIndex]
    depth: int
    """Layers a lazily grown cache list is extended to before a block gets its entry (the
    plan's largest layer index + 1), so that every block sees a list of one length."""
    collector: Any = None
    """transformers' output collector (``CompileableContextVar``); ``None``: not transformers."""
    notes: dict[str, str] = attrs.Factory(dict)
    """Reasons a cache was passed through or run outside the graph, by key (said once each)."""
    encoder_decoder_class: Any = None
    """transformers' ``EncoderDecoderCache`` (``None``: not split, passed through whole)."""
    encoder_decoder_view: Any = None
    """Its per-layer view class (:func:`encoder_decoder_view_class`)."""
    view_classes: dict[tuple[type, bool], type] = attrs.Factory(dict)
    """(cache class, outside) -> its view class, once built. A plain dict, not the cached
    :func:`view_class` alone: an outer ``torch.compile`` that traces this call (a double compile)
    reads a constant from it, where tracing into the class factory (torch 2.15 ignores the cache
    wrapper) breaks the graph on ``property()`` before the region is reached."""
    splits: dict[type, tuple[str, type]] = attrs.Factory(dict)
    """Cache class -> (its per-layer list's name, its view class), for the classes found plainly
    split (a declaration matches, no per-layer method overridden, not an
    ``EncoderDecoderCache``): what :meth:`layer_view` decides once per class."""

    def layer_view(self, block: nn.Module, cache: Any) -> Any:
        """The object the compiled block receives instead of ``cache``.

        Runs in front of every block call: a cache of a class :attr:`splits` knows, whose entry
        for the block exists and which does not offload, gets its view from one lookup; any
        other goes the whole way (:meth:`_decided_view`), as the first one did."""
        split = self.splits.get(type(cache))
        if split is not None:
            index = self.indices.get(block)
            entries = getattr(cache, split[0], None)
            if (
                index is not None
                and isinstance(entries, list)
                and index.value < len(entries)
                and getattr(cache, "offloading", False) is not True
            ):
                return split[1](cache, entries[index.value], index)
        return self._decided_view(block, cache)

    def _decided_view(self, block: nn.Module, cache: Any) -> Any:
        index = self.indices.get(block)
        if index is None:
            return cache
        if self.encoder_decoder_class is not None and isinstance(cache, self.encoder_decoder_class):
            return self._encoder_decoder_view(index, cache)
        resolved = self._spec_for(cache)
        if resolved is None:
            return cache  # no declaration matches it (a plugin's own view, say): not ours
        reason = self._unsplittable(index, cache, resolved)
        if reason is not None:
            self._note(type(cache).__name__, reason, PASSED_WHOLE)
            return cache
        reason = self._half_reason(index, cache)  # offloads, or overrides a per-layer method
        if reason is not None:
            self._note(type(cache).__name__, reason)
        view = self._view(index, cache, outside=offloads(cache))
        if not overridden(type(cache), resolved):
            self.splits[type(cache)] = (
                resolved.spec.layers,
                self._view_class(type(cache), resolved, False),
            )
        return view

    def _spec_for(self, cache: Any) -> ResolvedSpec | None:
        return next((r for r in self.specs if isinstance(cache, r.cache_type)), None)

    def _unsplittable(self, index: LayerIndex, cache: Any, resolved: ResolvedSpec) -> str | None:
        """Why ``cache`` has no entry for ``index``, or ``None`` (then the entry exists)."""
        entries = getattr(cache, resolved.spec.layers, None)
        name = type(cache).__name__
        if not isinstance(entries, list):
            return f"{name} has no per-layer list {resolved.spec.layers!r}"
        replicate = getattr(cache, "layer_class_to_replicate", None)
        if len(entries) <= index.value < self.depth and replicate is not None:
            # What transformers' Cache.update does first, done for the whole depth here: the
            # entry exists to hand over, and every block sees one list length.
            while len(entries) < self.depth:
                entries.append(replicate())
        if len(entries) <= index.value:
            return f"{name} has no layer {index.value}"
        return None

    def _encoder_decoder_view(self, index: LayerIndex, cache: Any) -> Any:
        """The block's view of an ``EncoderDecoderCache``: both halves split per layer and its
        ``is_updated`` flags seen through :class:`LayerFlags`; passed through whole (said once
        on stderr) when either half cannot be split."""
        halves = (cache.self_attention_cache, cache.cross_attention_cache)
        for half in halves:
            reason = self._half_reason(index, half)
            if reason is not None:
                name = type(cache).__name__
                self._note(
                    name, f"{name} holds a cache that cannot be split ({reason})", PASSED_WHOLE
                )
                return cache
        own, cross = (self._view(index, half, outside=False) for half in halves)
        return self.encoder_decoder_view(cache, own, cross, LayerFlags(cache.is_updated, index))

    def _half_reason(self, index: LayerIndex, cache: Any) -> str | None:
        resolved = self._spec_for(cache)
        name = type(cache).__name__
        if resolved is None:
            return f"{name} matches no layer cache declaration"
        if offloads(cache):
            return f"{name} offloads layers (offloading=True)"
        names = overridden(type(cache), resolved)
        if names:
            base = resolved.cache_type.__name__
            return f"{name} overrides " + ", ".join(f"{base}.{method}" for method in names)
        return self._unsplittable(index, cache, resolved)

    def _view(self, index: LayerIndex, cache: Any, outside: bool) -> LayerView:
        resolved = self._spec_for(cache)
        assert resolved is not None  # checked by the caller
        view = self._view_class(type(cache), resolved, outside)
        return view(cache, getattr(cache, resolved.spec.layers)[index.value], index)

    def _view_class(self, cache_class: type, resolved: ResolvedSpec, outside: bool) -> type:
        view = self.view_classes.get((cache_class, outside))
        if view is None:
            view = view_class(cache_class, resolved, outside)  # type: ignore[arg-type]
            self.view_classes[(cache_class, outside)] = view
        return view

    def split_defined_classes(self) -> None:
        """Fill :attr:`splits` for every cache class defined now (each declaration's class and
        its subclasses), at compile time, so that a block's first call finds its cache's class
        decided too; a class defined later is decided at its first call (:meth:`_decided_view`).
        A class goes to the first declaration it is a subclass of, as :meth:`_spec_for` does."""
        seen: set[type] = set()
        for resolved in self.specs:
            for cache_class in with_subclasses(resolved.cache_type):
                if cache_class in seen:
                    continue
                seen.add(cache_class)
                encoder_decoder = self.encoder_decoder_class
                if encoder_decoder is not None and issubclass(cache_class, encoder_decoder):
                    continue
                if not overridden(cache_class, resolved):
                    view = self._view_class(cache_class, resolved, False)
                    self.splits[cache_class] = (resolved.spec.layers, view)

    def _note(self, key: str, reason: str, consequence: str = RUN_OUTSIDE) -> None:
        if key in self.notes:
            return
        self.notes[key] = reason
        warnings.warn(
            f"torchkiln: transformers adapter: group {self.group!r}: {reason}, {consequence}",
            PartialCompileWarning,
            stacklevel=2,
        )

    def wrap_call(self, compiled: Callable[..., Any]) -> Callable[..., Any]:
        """``compiled(module, *args, **kwargs)`` with the cache argument replaced by the block's
        view and transformers' output collector in its compile-friendly mode."""
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
            if encoder_decoder_view is not None and isinstance(view, encoder_decoder_view):
                try:
                    return run(module, *args, **kwargs)
                finally:
                    view.is_updated.write_back()  # the layer's flag, set in the trace
            return run(module, *args, **kwargs)

        # transformers' output collector in its traceable mode for this block's call only
        # (docs/generation.md): nothing to do for a model that has none.
        run = (
            compiled
            if collector is None
            else functools.partial(call_collecting_per_block, collector, compiled)
        )
        call.__name__ = call.__qualname__ = getattr(compiled, "__name__", "call")
        return call


def offloads(cache: Any) -> bool:
    return getattr(cache, "offloading", False) is True


TRANSFORMERS_CACHE = LayerCacheSpec(
    name="transformers",
    cache_type="transformers.cache_utils:Cache",
    index_attributes=("layer_idx", "layer_id"),
)
"""transformers' ``Cache`` (and every subclass): its ``layers`` list and every method that takes
a ``layer_idx``, for blocks that keep their index in ``layer_idx`` (most) or ``layer_id``
(GPT-Neo)."""


@hookimpl
def declare_layer_caches() -> list[LayerCacheSpec]:
    return [TRANSFORMERS_CACHE]


def group_indices(
    group: RegionGroup, blocks: list[nn.Module], specs: tuple[LayerCacheSpec, ...]
) -> tuple[list[LayerIndex], tuple[str, ...]] | None:
    """:func:`find_layer_indices` of ``group``'s blocks, the declared index attributes first."""
    declared = tuple(dict.fromkeys(name for spec in specs for name in spec.index_attributes))
    return find_layer_indices(blocks, [region.path for region in group.regions], declared)


def block_adapter(
    group_name: str,
    blocks: list[nn.Module],
    indices: list[LayerIndex],
    specs: tuple[LayerCacheSpec, ...],
    depth: int = 0,
) -> BlockAdapter | None:
    """The adapter for a group of ``blocks``, or ``None`` when they take no declared cache
    parameter or no declaration's cache class is imported."""
    resolved = tuple(r for r in (resolve(spec) for spec in specs) if r is not None)
    if not resolved:
        return None
    names = tuple(dict.fromkeys(name for r in resolved for name in r.spec.cache_parameters))
    parameter = cache_parameter(blocks[0], names)
    if parameter is None:
        return None
    by_block = weakref.WeakKeyDictionary(zip(blocks, indices, strict=True))
    depth = max(depth, max(index.value for index in indices) + 1)
    adapter = BlockAdapter(group_name, *parameter, resolved, by_block, depth)
    inner = activation_wrapped(blocks[0])
    if is_transformers_module(inner) and "transformers.cache_utils" in sys.modules:
        from transformers import cache_utils

        adapter.collector = active_collector()
        encoder_decoder = getattr(cache_utils, "EncoderDecoderCache", None)
        if encoder_decoder is not None:
            adapter.encoder_decoder_class = encoder_decoder
            adapter.encoder_decoder_view = encoder_decoder_view_class(encoder_decoder)
    adapter.split_defined_classes()
    return adapter


def plan_depth(model: nn.Module, plan: RegionPlan, specs: tuple[LayerCacheSpec, ...]) -> int:
    """The largest layer index of the blocks that take a declared cache, + 1 (0: none)."""
    names = tuple(dict.fromkeys(name for spec in specs for name in spec.cache_parameters))
    depth = 0
    for group in plan.groups:
        blocks = [model.get_submodule(region.path) for region in group.regions]
        if not blocks or cache_parameter(blocks[0], names) is None:
            continue
        found = group_indices(group, blocks, specs)
        if found is not None:
            depth = max(depth, *(index.value + 1 for index in found[0]))
    return depth


@hookimpl
def prepare_group(
    model: nn.Module,
    plan: RegionPlan,
    group: RegionGroup,
    config: CompileConfig,
    layer_caches: Sequence[LayerCacheSpec],
) -> GroupPreparation | None:
    """Blocks that take a declared cache get their own layer's view (see the module doc).

    The cost on the forward path is one eager Python call per block call (find the cache
    argument, build a small view object); docs/generation.md measures it.
    """
    specs = tuple(layer_caches)
    blocks = [model.get_submodule(region.path) for region in group.regions]
    # Only for checkpointed blocks: an instance forward on a submodule is guarded by identity,
    # so a saved entry (store, precompile) would not load in another process.
    checkpointed = [block for block in blocks if getattr(block, "gradient_checkpointing", False)]
    forwards = tuple(pair for block in checkpointed for pair in unrouted_forwards(block))
    found = group_indices(group, blocks, specs)
    if found is not None:
        indices, names = found
        adapter = block_adapter(group.name, blocks, indices, specs, plan_depth(model, plan, specs))
        if adapter is not None:
            settings = functools.partial(layer_index_dynamic, names)
            return GroupPreparation(
                wrap_call=adapter.wrap_call, trace_settings=settings, forwards=forwards
            )
    return GroupPreparation(forwards=forwards) if forwards else None


def unrouted_forwards(block: nn.Module) -> list[tuple[nn.Module, Callable[..., Any]]]:
    """Submodules of ``block`` (attention, with transformers 5.25) whose forward Hugging Face
    ``kernels`` wraps to route its function modules, each with the forward it wrapped. The
    wrapper stores to a global object inside the block: a side effect that Dynamo refuses
    inside a higher-order op (a checkpointed block breaks the graph there) and that stops a
    nested block's reuse. With no kernel installed the original forward computes the same
    (:func:`torchkiln._internals.hub_kernels.unrouted_forward`)."""
    found = (
        (module, unrouted_forward(module)) for module in block.modules() if module is not block
    )
    return [(module, forward) for module, forward in found if forward is not None]
