"""The region plan: which submodules are compiled, and which share compiled code.

A *region* is one submodule whose ``forward`` is compiled in place. Regions in one *group*
share one compiled function (the same Dynamo code object and cache), so a stack of 32
identical transformer blocks is traced and compiled once and reused 31 times.
"""

from __future__ import annotations

from collections.abc import Iterator

import attrs
from torch import nn


@attrs.frozen
class Region:
    """One submodule compiled in place."""

    path: str
    """Dotted path from the root model (``model.layers.3``); ``""`` is the root itself."""
    module: nn.Module = attrs.field(eq=False, repr=False)
    """The module at :attr:`path` in the model (not compared, not shown by ``repr``)."""
    group: str
    """Name of the :class:`RegionGroup` this region belongs to."""

    @property
    def display_path(self) -> str:
        """:attr:`path`, with the root shown as ``<root>``."""
        return self.path or "<root>"


@attrs.frozen
class RegionGroup:
    """Regions that share one compiled function: the first region's class ``forward``, bound to
    each module. All regions of a group must have a class with that same ``forward`` function
    (checked before anything is touched); the built-in selectors group structurally identical
    modules (:func:`torchkiln.plugin.group_by_structure`), so each group compiles one graph."""

    name: str
    """Unique within a plan; the built-in selectors use the block's class name, with ``_2``,
    ``_3``... for further shapes of one class."""
    regions: tuple[Region, ...]
    """At least one region; each :attr:`Region.group` is this group's :attr:`name`."""
    reason: str = ""
    """Why these modules were selected (``16x LlamaDecoderLayer, structurally identical``)."""
    nested: tuple[RegionGroup, ...] = ()
    """Blocks inside this group's regions that a selector wants treated on their own (the
    ``hierarchical`` selector marks them with ``torch.compiler.nested_compile_region``). The
    engine does nothing with them; they are shown by ``torchkiln plan`` and a
    ``prepare_group`` implementation may act on them."""

    @property
    def module_class(self) -> type[nn.Module]:
        return type(self.regions[0].module)


@attrs.frozen
class EagerPart:
    """A part of the model that stays eager, and why."""

    path: str
    """Dotted path of the largest subtree that holds no region."""
    reason: str
    """Why it stays eager (``outside the selected regions (regions.rest=eager)``,
    ``excluded (regions.exclude)``)."""


@attrs.frozen
class RegionPlan:
    """What a selector decided. Returned by ``select_regions`` and by :func:`torchkiln.plan`."""

    selector: str
    """The selector that made the plan (after ``auto`` resolved: ``repeated`` or ``whole``)."""
    groups: tuple[RegionGroup, ...]
    """The groups, in compile order."""
    eager: tuple[EagerPart, ...] = ()
    """What runs eagerly, and why (informational: the engine compiles only :attr:`groups`)."""
    reason: str = ""
    """One line saying why this plan was chosen, and for ``repeated`` the level chosen and why
    (shown by ``torchkiln plan`` and logged)."""
    requested: str = ""
    """The selector the configuration asked for (``regions.strategy``: ``auto``, or
    ``hierarchical`` when it fell back), when it differs from :attr:`selector`; else ``""``."""

    @property
    def nested(self) -> tuple[RegionGroup, ...]:
        """Every group's :attr:`RegionGroup.nested` blocks, in group order."""
        return tuple(inner for group in self.groups for inner in group.nested)

    def regions(self) -> Iterator[Region]:
        for group in self.groups:
            yield from group.regions

    @property
    def region_count(self) -> int:
        return sum(len(g.regions) for g in self.groups)

    def to_dict(self) -> dict[str, object]:
        return {
            "selector": self.selector,
            "requested": self.requested or self.selector,
            "reason": self.reason,
            "groups": [
                {
                    "name": g.name,
                    "class": f"{g.module_class.__module__}.{g.module_class.__qualname__}",
                    "reason": g.reason,
                    "regions": [r.path for r in g.regions],
                }
                for g in self.groups
            ],
            "eager": [{"path": e.path, "reason": e.reason} for e in self.eager],
            "nested": [
                {"name": g.name, "regions": [r.path for r in g.regions]} for g in self.nested
            ],
        }
