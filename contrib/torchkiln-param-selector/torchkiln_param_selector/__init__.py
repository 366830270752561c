"""torchkiln plugin: region strategy ``params``, regions chosen by parameter count or by a
user-declared attribute.

1. If any module sets ``torchkiln_region = True`` (on its class or on the instance), exactly
   those modules are the regions (a marked module inside another marked one is not separate).
2. Otherwise the regions are the *smallest modules holding at least* ``min_params``
   parameters: walking down from the root, a module is picked when it holds ``min_params`` or
   more and none of its children does. For a transformer, set ``min_params`` a little below one
   block's size and the blocks are picked. ``min_params`` is ``regions.options["min_params"]``
   where torchkiln has that field, else 10% of the model's parameters.

Regions are grouped by exact class (one compiled function per class); ``regions.exclude``
globs are honoured.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator, Mapping
from typing import Any

from torch import nn

from torchkiln.plugin import EagerPart, Region, RegionGroup, RegionPlan, SelectorSpec, hookimpl

__version__ = "0.1.0"

NAME = "params"
ATTRIBUTE = "torchkiln_region"
DEFAULT_FRACTION = 0.1


def parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def marked(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Modules with ``torchkiln_region = True``, outermost only."""
    found: list[tuple[str, nn.Module]] = []
    for path, module in model.named_modules():
        inside = any(path.startswith(f"{outer}.") or outer == "" for outer, _ in found)
        if getattr(module, ATTRIBUTE, False) is True and not inside:
            found.append((path, module))
    return found


def smallest_holding(
    module: nn.Module, min_params: int, path: str = ""
) -> Iterator[tuple[str, nn.Module]]:
    """The smallest modules under ``module`` with at least ``min_params`` parameters."""
    if parameter_count(module) < min_params:
        return
    big = [
        (name, child)
        for name, child in module.named_children()
        if parameter_count(child) >= min_params
    ]
    if not big:
        yield path, module
    for name, child in big:
        yield from smallest_holding(child, min_params, f"{path}.{name}" if path else name)


def min_params_for(model: nn.Module, config: Any) -> tuple[int, str]:
    options: Mapping[str, Any] = getattr(config.regions, "options", None) or {}
    if "min_params" in options:
        return int(options["min_params"]), "regions.options.min_params"
    return max(
        1, int(parameter_count(model) * DEFAULT_FRACTION)
    ), f"{DEFAULT_FRACTION:.0%} of the model"


def plan(model: nn.Module, config: Any) -> RegionPlan:
    found = marked(model)
    if found:
        why = f"sets {ATTRIBUTE} = True"
    else:
        min_params, source = min_params_for(model, config)
        found = list(smallest_holding(model, min_params))
        why = f"smallest modules with >= {min_params:,} parameters ({source})"
    excluded = {
        p for p, _ in found if any(fnmatch.fnmatchcase(p, g) for g in config.regions.exclude)
    }
    by_class: dict[type, list[Region]] = {}
    for path, module in found:
        if path not in excluded:
            by_class.setdefault(type(module), []).append(
                Region(path, module, type(module).__name__)
            )
    groups = tuple(RegionGroup(cls.__name__, tuple(rs), why) for cls, rs in by_class.items())
    eager = tuple(EagerPart(p, "excluded (regions.exclude)") for p in sorted(excluded))
    count = sum(len(g.regions) for g in groups)
    return RegionPlan(NAME, groups, eager=eager, reason=f"params: {count} regions: {why}")


@hookimpl
def declare_selectors() -> list[SelectorSpec]:
    return [
        SelectorSpec(
            NAME,
            f"modules by parameter count, or those setting {ATTRIBUTE} = True",
            options=("min_params",),
        )
    ]


@hookimpl
def select_regions(model: nn.Module, config: Any) -> RegionPlan:
    return plan(model, config)  # torchkiln calls it only for the selector declared above
