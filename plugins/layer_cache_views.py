"""Per-layer views of a model's cache, handed to compiled blocks (the machinery of the built-in
adapter :mod:`torchkiln.plugins.transformers_models`; not a plugin itself).

A block passes the whole cache and its own layer index (``cache.update(k, v, self.layer_idx)``),
and the cache picks the layer's entry from a Python list; Dynamo specialises a list index, so
every block would compile its own graph. A :class:`LayerView`, built eagerly for one block
call from a :class:`~torchkiln.plugin.LayerCacheSpec` and a :class:`LayerIndex`, replaces the
cache and gives the block its own entry for its own index. "Own index" is decided in the trace
against the module attribute the block read it from (the same symbolic int), so it leaves no
per-layer guard, and one graph serves every depth. docs/generation.md says what the adapter does.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
from collections.abc import Sequence
from typing import Any

import attrs
import torch
from torch import nn

from torchkiln.plugin import LayerCacheSpec, PluginError


@attrs.frozen
class LayerIndex:
    """Where one block keeps its layer index: ``holder.<attribute> == value``."""

    attribute: str
    holder: nn.Module
    """The block or the submodule of it that holds the attribute."""
    value: int

    def is_own(self, index: Any) -> bool:
        """Whether ``index`` is the block's own, compared with the attribute itself (in the
        trace, the symbolic int the block read), so it leaves no per-layer guard."""
        return bool(index == getattr(self.holder, self.attribute))


@attrs.frozen
class LayerMethod:
    """A per-layer method: where its layer index is among its arguments (``self`` left out)."""

    name: str
    function: Any
    position: int | None
    """Position among the positional arguments (``None``: keyword only)."""
    keyword: str
    default: Any


@attrs.frozen
class ResolvedSpec:
    """A :class:`LayerCacheSpec` whose cache class is imported, with its methods looked up."""

    spec: LayerCacheSpec
    cache_type: type
    methods: tuple[LayerMethod, ...]


def resolve(spec: LayerCacheSpec) -> ResolvedSpec | None:
    """``spec`` with its class and methods, or ``None`` while its module is not imported (then
    no cache of that class can exist, and declaring it imported nothing)."""
    if not isinstance(spec.cache_type, str):
        return _resolved(spec, spec.cache_type)
    module_name, qualified = spec.cache_type.split(":")
    if module_name not in sys.modules:
        return None
    found: Any = functools.reduce(
        getattr, qualified.split("."), importlib.import_module(module_name)
    )
    return _resolved(spec, found)


_RESOLVED: list[ResolvedSpec] = []
"""Every spec resolved in this process, in order: what :func:`__getattr__` builds views from."""


@functools.cache
def _resolved(spec: LayerCacheSpec, cache_type: type) -> ResolvedSpec:
    names = spec.methods
    if names is None:
        names = tuple(
            name
            for name in sorted(dir(cache_type))
            if not name.startswith("__")
            and inspect.isfunction(inspect.getattr_static(cache_type, name, None))
            and spec.index_parameter in _parameters(getattr(cache_type, name))
        )
    methods = tuple(_method(spec, cache_type, name) for name in names)
    _RESOLVED.append(resolved := ResolvedSpec(spec, cache_type, methods))
    return resolved


def _parameters(function: Any) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return {}


def _method(spec: LayerCacheSpec, cache_type: type, name: str) -> LayerMethod:
    function = inspect.getattr_static(cache_type, name, None)
    parameters = list(_parameters(function).values())[1:]  # self left out
    index = next((p for p in parameters if p.name == spec.index_parameter), None)
    if not inspect.isfunction(function) or index is None:
        raise PluginError(
            f"layer cache {spec.name!r}: {cache_type.__name__}.{name} is not a method with a "
            f"parameter {spec.index_parameter!r} (LayerCacheSpec.methods names methods of "
            "cache_type that take the layer index)"
        )
    positional = index.kind in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    )
    default = None if index.default is inspect.Parameter.empty else index.default
    return LayerMethod(
        name, function, parameters.index(index) if positional else None, index.name, default
    )


# --- finding a block's layer index ------------------------------------------------------------


def int_attributes(block: nn.Module) -> dict[str, tuple[nn.Module, set[int]]]:
    """Plain integer attributes of ``block`` and its submodules: name -> (first holder, values)."""
    found: dict[str, tuple[nn.Module, set[int]]] = {}
    for module in block.modules():
        for name, value in vars(module).items():
            if type(value) is int and not name.startswith("_"):  # bools are not indices
                found.setdefault(name, (module, set()))[1].add(value)
    return found


def find_layer_indices(
    blocks: Sequence[nn.Module], paths: Sequence[str], declared: Sequence[str]
) -> tuple[list[LayerIndex], tuple[str, ...]] | None:
    """Each block's :class:`LayerIndex`, and every attribute name that numbers the blocks (to
    trace as symbolic), or ``None`` when no attribute does.

    An attribute numbers the blocks when every block holds it with one value (wherever in the
    block it is held) and no two blocks hold the same value. Among those: the first of
    ``declared``; else one equal to each block's position in its container (``h.3`` holds 3);
    else the first by name. A single block cannot show which attribute numbers it: only a
    declared name counts then.
    """
    attributes = [int_attributes(block) for block in blocks]
    candidates = []
    for name in sorted(set.intersection(*(set(found) for found in attributes))):
        values = [found[name][1] for found in attributes]
        if all(len(v) == 1 for v in values) and len({next(iter(v)) for v in values}) == len(blocks):
            candidates.append(name)
    if len(blocks) < 2:
        candidates = [name for name in candidates if name in declared]
    if not candidates:
        return None
    positions = [path.rsplit(".", 1)[-1] for path in paths]
    chosen = next((name for name in declared if name in candidates), None)
    if chosen is None:
        chosen = next(
            (
                name
                for name in candidates
                if all(
                    str(next(iter(f[name][1]))) == p
                    for f, p in zip(attributes, positions, strict=True)
                )
            ),
            candidates[0],
        )
    indices = [
        LayerIndex(chosen, found[chosen][0], next(iter(found[chosen][1]))) for found in attributes
    ]
    return indices, tuple(candidates)


# --- the views ----------------------------------------------------------------------------------


class LayerList:
    """A cache's per-layer list as one block sees it: the block's own index gives its own entry
    (decided in the trace, with no guard); any other index, the whole list's.

    It holds the cache, not the list: the trace reads the whole list only for another index
    (or its length), so the block's own entry is never also seen as ``list[i]``, which would
    make Dynamo guard on that aliasing (``cache.layers[0] is own``): one more graph.
    """

    def __init__(self, cache: Any, name: str, own: Any, index: LayerIndex):
        self._torchkiln_cache = cache
        self._torchkiln_name = name
        self._torchkiln_own = own
        self._torchkiln_index = index

    def __getitem__(self, position: Any) -> Any:
        if self._torchkiln_index.is_own(position):
            return self._torchkiln_own
        return getattr(self._torchkiln_cache, self._torchkiln_name)[position]

    def __len__(self) -> int:
        return len(getattr(self._torchkiln_cache, self._torchkiln_name))

    def __iter__(self) -> Any:
        return iter(getattr(self._torchkiln_cache, self._torchkiln_name))

    def append(self, entry: Any) -> None:
        getattr(self._torchkiln_cache, self._torchkiln_name).append(entry)


class LayerView:
    """One block's view of a cache, built eagerly, outside the compiled code.

    Its per-layer list (``view.layers``, a :class:`LayerList`) gives the block's own entry for
    the block's own index, without indexing the list in the trace. Each declared per-layer
    method, called with the block's own index, runs the cache class's own code with the view as
    ``self``, so it reaches the block's entry through that list; with any other index it runs on
    the whole cache, as it always did. The per-layer methods are added per cache class by
    :func:`view_class`; everything else is the whole cache's answer.
    """

    def __init__(self, cache: Any, own: Any, index: LayerIndex):
        self._torchkiln_cache = cache
        self._torchkiln_own = own
        self._torchkiln_index = index

    def __getattr__(self, name: str) -> Any:
        # Only reached for names the view does not define: the whole cache answers. Its own
        # fields are missing only while unpickling (torch's saved guards): no recursion then.
        if name.startswith("_torchkiln_"):
            raise AttributeError(name)
        return getattr(self._torchkiln_cache, name)

    def __len__(self) -> int:
        return len(self._torchkiln_cache)

    def __iter__(self) -> Any:
        return iter(self._torchkiln_cache)

    def __repr__(self) -> str:
        index = self._torchkiln_index
        return f"{type(self).__name__}({self._torchkiln_cache!r}, layer {index.value})"


def _call_whole(cache: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return getattr(cache, name)(*args, **kwargs)


_call_outside_graph = torch.compiler.disable(_call_whole)


def _split_method(method: LayerMethod) -> Any:
    name, function, position, keyword, default = attrs.astuple(method, recurse=False)

    def per_layer(self: LayerView, *args: Any, **kwargs: Any) -> Any:
        if position is not None and len(args) > position:
            index = args[position]
        else:
            index = kwargs.get(keyword, default)
        if index is not None and self._torchkiln_index.is_own(index):
            return function(self, *args, **kwargs)  # the class's own code, on this layer's view
        return getattr(self._torchkiln_cache, name)(*args, **kwargs)

    per_layer.__name__ = per_layer.__qualname__ = name
    return per_layer


def _outside_method(name: str) -> Any:
    def outside(self: LayerView, *args: Any, **kwargs: Any) -> Any:
        return _call_outside_graph(self._torchkiln_cache, name, args, kwargs)

    outside.__name__ = outside.__qualname__ = name
    return outside


@functools.cache
def view_class(cache_class: type, resolved: ResolvedSpec, outside: bool) -> type:
    """The view class for caches of ``cache_class``: ``resolved``'s per-layer methods, each
    running on the view (``outside=False`` and not overridden by ``cache_class``) or on the
    whole cache outside the compiled graph (``torch.compiler.disable``)."""
    name = resolved.spec.layers
    members: dict[str, Any] = {
        name: property(
            lambda self: LayerList(
                self._torchkiln_cache, name, self._torchkiln_own, self._torchkiln_index
            )
        )
    }
    overrides = overridden(cache_class, resolved)
    for method in resolved.methods:
        split = not outside and method.name not in overrides
        members[method.name] = _split_method(method) if split else _outside_method(method.name)
    return _importable(type(_view_name(cache_class, outside), (LayerView,), members))


def _view_name(cache_class: type, outside: bool) -> str:
    name = f"{cache_class.__name__}{'Outside' if outside else ''}LayerView"
    count = 1
    while globals().get(name if count == 1 else f"{name}{count}") is not None:
        count += 1  # another declaration for a class of the same name
    return name if count == 1 else f"{name}{count}"


def _importable(view: type) -> type:
    """The class set as an attribute of this module under its own name, so that what pickles
    it by reference (torch saving a precompiled function's guards) finds it, here and in a
    process that builds the same views before loading."""
    view.__module__ = __name__
    view.__qualname__ = view.__name__
    globals()[view.__name__] = view
    return view


def __getattr__(name: str) -> type:
    """A view class this process has not built yet, asked for by name: what unpickling a
    precompiled function's guards does in a new process, before any call has built a view. It
    is built here, as a call would, from the specs resolved so far (the adapter resolves them
    when it prepares a group, before artifacts are loaded)."""
    stem = name.removesuffix("LayerView")
    outside_by_class = {stem: False}  # a class name matches one key at most
    if stem.endswith("Outside"):
        outside_by_class[stem.removesuffix("Outside")] = True
    for resolved in list(_RESOLVED) if name.endswith("LayerView") else ():
        for cache_class in with_subclasses(resolved.cache_type):
            outside = outside_by_class.get(cache_class.__name__)
            if outside is None:
                continue
            view = view_class(cache_class, resolved, outside)
            if view.__name__ == name:
                return view
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def with_subclasses(cls: type) -> list[type]:
    found = [cls]
    subclass: type
    for subclass in cls.__subclasses__():
        found += with_subclasses(subclass)
    return found


def overridden(cache_class: type, resolved: ResolvedSpec) -> list[str]:
    """The per-layer methods ``cache_class`` overrides (they run outside the graph)."""
    return [
        method.name
        for method in resolved.methods
        if inspect.getattr_static(cache_class, method.name, None) is not method.function
    ]


class LayerFlags:
    """An ``EncoderDecoderCache.is_updated`` dict as one layer sees it.

    ``is_updated[layer_idx]`` (and ``.get``) with the block's own index reads and writes a
    flag on this object, copied from the whole dict before the block runs and back after it
    (:meth:`torchkiln.plugins.transformers_models.BlockAdapter.wrap_call`), so the trace neither looks a key up in the dict nor
    writes one (both would specialise on the index). Any other index: the whole dict.
    """

    def __init__(self, flags: dict[Any, Any], index: LayerIndex):
        self._torchkiln_flags = flags
        self._torchkiln_index = index
        self._torchkiln_value = bool(flags.get(index.value, False))

    def get(self, index: Any, default: Any = None) -> Any:
        if self._torchkiln_index.is_own(index):
            return self._torchkiln_value
        return self._torchkiln_flags.get(index, default)

    def __getitem__(self, index: Any) -> Any:
        if self._torchkiln_index.is_own(index):
            return self._torchkiln_value
        return self._torchkiln_flags[index]

    def __setitem__(self, index: Any, value: Any) -> None:
        if self._torchkiln_index.is_own(index):
            self._torchkiln_value = value
        else:
            self._torchkiln_flags[index] = value

    def write_back(self) -> None:
        """Copy this layer's flag into the whole dict (eager, after the block)."""
        self._torchkiln_flags[self._torchkiln_index.value] = bool(self._torchkiln_value)


@functools.cache
def encoder_decoder_view_class(base: type) -> type:
    """A subclass of transformers' ``EncoderDecoderCache`` (``base``; the models check
    ``isinstance``) for one layer's view: both halves are that layer's
    :class:`~torchkiln.plugins.layer_cache_views.LayerView` and ``is_updated`` its
    :class:`LayerFlags`. Anything else is the whole cache's answer."""

    class EncoderDecoderLayerCache(base):  # type: ignore[misc, valid-type]
        def __init__(self, cache: Any, own: LayerView, cross: LayerView, flags: LayerFlags):
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
            index = self.is_updated._torchkiln_index.value
            return f"EncoderDecoderLayerCache({self._torchkiln_cache!r}, layer {index})"

    return EncoderDecoderLayerCache
