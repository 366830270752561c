"""What plugins declare: backends, selectors, distributed strategies and per-layer caches.

Plugins return these from the declaration hooks (``declare_backends``, ``declare_selectors``,
``declare_distributed``, ``declare_layer_caches``) so that ``torchkiln plugins`` can list everything with its status and
configuration can be validated before anything is compiled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from torchkiln.plugin_host.report_causes import ReportCause


@attrs.frozen
class Availability:
    """Result of a backend's availability probe."""

    available: bool
    reason: str = ""
    """Why it is unavailable, in words a user can act on (include the install hint)."""

    @classmethod
    def yes(cls) -> Availability:
        return cls(True, "")

    @classmethod
    def no(cls, reason: str) -> Availability:
        return cls(False, reason)


def _lower_name(name: str) -> str:
    return name.lower()


def _always_available() -> Availability:
    return Availability.yes()


@attrs.frozen
class BackendSpec:
    """A compile backend a plugin provides, carrying its compile (:attr:`compile`) and whether
    what it compiles can be saved (:attr:`precompile`).

    A declaration without ``compile`` (plugins written before it existed) is compiled by the
    declaring plugin's ``compile_region`` hook.
    """

    name: str = attrs.field(converter=_lower_name)
    """Name users pass as ``backend=`` (matched case-insensitively)."""
    description: str = ""
    probe: Callable[[], Availability] = _always_available
    """Called lazily (never at import) to tell whether the backend can run here. It must not
    raise; it imports the vendor module it needs and reports failures as ``Availability.no``."""
    training: bool = True
    """Whether compiled regions support backward (``False`` means inference only)."""
    modes: tuple[str, ...] | None = None
    """Accepted ``mode`` values, or ``None`` for any. ``None`` as a mode is always accepted."""
    options: tuple[str, ...] | None = None
    """Accepted keys of ``options``, or ``None`` for any. Any other key is refused before
    anything is compiled, with the closest accepted key."""
    devices: tuple[str, ...] = ()
    """Device types the backend compiles for (``cpu``, ``cuda``, ``xla``, ``hpu``, ...); empty
    means whatever device the model is on."""
    precompile: bool = False
    """Whether the backend's compiled functions can be saved ahead of time and loaded in
    another process (``torchkiln precompile``): its ``compile_region`` returns a
    ``torch.compile`` function whose ``aot_compile`` result torch can serialise. ``False``:
    precompiling with it is refused with a clear error, and ``artifacts=`` warns and
    compiles normally."""
    compile: Callable[..., Any] | None = attrs.field(default=None, eq=False)
    """``compile(fn, group, config) -> compiled``: the backend's compile of one region group's
    function, called once per group (``fn(module, *args, **kwargs)``); it returns a callable
    with the same signature (``torchkiln.plugin.compile_with_torch(fn, config)`` for a
    backend torch knows). ``None``: the declaring plugin's ``compile_region`` serves it."""
    origin: str = "plugin"
    """``plugin`` for a backend a torchkiln plugin declares, ``torch`` for one only torch knows."""
    report_causes: tuple[ReportCause, ...] = ()
    """Known causes of recompiles or graph breaks this plugin knows about (a vendor op that
    always breaks the graph, say): ``torchkiln.report`` names them, with their remedy, when a
    reason matches (see ``docs/guide.md``, "Named causes")."""


@attrs.frozen
class SelectorSpec:
    """A selector (chosen with ``regions.strategy``) a plugin provides: it decides which
    submodules are compiled."""

    name: str = attrs.field(converter=_lower_name)
    description: str = ""
    options: tuple[str, ...] | None = None
    """Accepted keys of ``regions.options``, or ``None`` for any (a selector declared before
    selectors could declare options). Any other key is refused before anything is compiled,
    with the closest accepted key."""
    report_causes: tuple[ReportCause, ...] = ()
    """Known causes of recompiles or graph breaks this plugin knows about (a vendor op that
    always breaks the graph, say): ``torchkiln.report`` names them, with their remedy, when a
    reason matches (see ``docs/guide.md``, "Named causes")."""


@attrs.frozen
class DistributedSpec:
    """A distributed strategy (value of ``distributed.strategy``) a plugin provides."""

    name: str = attrs.field(converter=_lower_name)
    description: str = ""
    probe: Callable[[], Availability] = _always_available
    """Tells whether the strategy's engine is installed (DeepSpeed, say)."""
    report_causes: tuple[ReportCause, ...] = ()
    """Known causes of recompiles or graph breaks this plugin knows about (a vendor op that
    always breaks the graph, say): ``torchkiln.report`` names them, with their remedy, when a
    reason matches (see ``docs/guide.md``, "Named causes")."""


def _names(value: Any) -> tuple[str, ...]:
    """A tuple of names; a lone string is refused (it would read as one name per letter)."""
    if isinstance(value, str):
        raise TypeError(f"expected a tuple of names, got the string {value!r}")
    names = tuple(value)
    bad = [name for name in names if not isinstance(name, str) or not name.isidentifier()]
    if bad:
        raise TypeError(f"expected Python identifiers, got {bad!r}")
    return names


def _optional_names(value: Any) -> tuple[str, ...] | None:
    return None if value is None else _names(value)


def _cache_type(value: Any) -> type | str:
    if isinstance(value, type):
        return value
    if isinstance(value, str) and value.count(":") == 1 and all(value.split(":")):
        return value
    raise TypeError(f"cache_type must be a class or a 'module:QualifiedName' string, got {value!r}")


@attrs.frozen
class LayerCacheSpec:
    """A cache a model keeps per layer, and how its blocks index it.

    Blocks of a model with a cache (a KV cache, a state-space model's conv and recurrent
    states) pass the whole cache and their own layer index to it: ``cache.update(k, v,
    self.layer_idx)``, and the cache picks the layer's entry from a Python list. Traced, that
    list index specialises: every block compiles its own graph. The built-in adapter
    (``torchkiln.transformers_models``) hands each compiled block a view of the cache instead,
    built outside the compiled code, whose list gives the block's own entry and whose
    per-layer methods run on that view; this declaration tells it what a cache looks like.
    See ``docs/generation.md`` ("A model family torchkiln does not know").
    """

    name: str
    """Names the declaration in messages (``transformers``, ``my-paged-cache``)."""
    cache_type: type | str = attrs.field(converter=_cache_type)
    """The cache class (instances of subclasses match too), or ``"module:QualifiedName"``,
    looked up only once that module is imported (so declaring imports nothing)."""
    layers: str = "layers"
    """The cache's attribute holding one entry per layer (a list indexed by layer index)."""
    index_parameter: str = "layer_idx"
    """The name of the layer-index parameter of the per-layer methods."""
    methods: tuple[str, ...] | None = attrs.field(default=None, converter=_optional_names)
    """Methods of ``cache_type`` that take a layer index (``update``, ``update_conv_state``...).
    ``None``: every method of the class with a parameter named ``index_parameter``. Each runs
    with the block's view as ``self`` when the block passes its own index (its other reads
    go to the whole cache; it must not assign attributes on ``self``), and on the whole cache
    for any other index. A subclass that overrides one of them has it run outside the compiled
    graph (one graph break per call), said once on stderr."""
    index_attributes: tuple[str, ...] = attrs.field(default=("layer_idx",), converter=_names)
    """Names of the integer attribute a block (or a submodule of it) holds its layer index in,
    tried first, in order. Without one, the adapter takes the integer attribute that numbers
    the blocks of the group (one value per block, a different one in each)."""
    cache_parameters: tuple[str, ...] = attrs.field(
        default=("cache", "past_key_values", "past_key_value", "layer_past"), converter=_names
    )
    """Names of the block ``forward`` parameter the cache is passed in."""
