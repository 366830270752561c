"""What plugins declare: backends, selectors and distributed strategies.

Plugins return these from the declaration hooks (``declare_backends``, ``declare_selectors``,
``declare_distributed``) so that ``torchkiln plugins`` can list everything with its status and
configuration can be validated before anything is compiled.
"""

from __future__ import annotations

from collections.abc import Callable

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
    """A compile backend a plugin provides.

    The plugin that declares a backend also answers ``compile_region`` for it.
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
