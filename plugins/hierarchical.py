"""Built-in plugin: the ``hierarchical`` selector.

The whole model is compiled as one graph (one region, the root), and every repeated block
inside it is marked with ``torch.compiler.nested_compile_region``, so that Dynamo compiles the
block once and stamps it out at each call site: the steady-state speed of a full
``torch.compile`` with a cold start close to regional compilation. The nested blocks are the
``repeated`` selector's groups, asked for through the plugin manager (so ``regions.classes``
and ``regions.exclude`` apply). :func:`prepare_group` marks each block class's ``forward``
once (:func:`mark_nested`); a later ``prepare_group`` may install its own forward instead, as
``torchkiln.transformers_nested`` does. One marked region inside another is refused: upstream
it can silently compute wrong results. docs/hierarchical.md gives the torch releases' differences.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from torchkiln._internals.versions import feature_problem
from torchkiln.plugin import (
    CompileConfig,
    GroupPreparation,
    Region,
    RegionGroup,
    RegionPlan,
    SelectorSpec,
    TorchkilnError,
    hookimpl,
    select_with,
)

NAME = "hierarchical"


class NestedRegionError(TorchkilnError):
    """Two nested compile regions would contain one another."""


@hookimpl
def declare_selectors() -> list[SelectorSpec]:
    return [
        SelectorSpec(
            NAME,
            "the whole model as one graph, each repeated block marked with "
            "torch.compiler.nested_compile_region (compiled once, stamped out N times)",
            options=(),
        )
    ]


def mark_nested(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a plain function (a block class's ``forward``) as a nested compile region.

    Only the function is passed, positionally: the one form torch 2.11 and 2.12+ both accept.
    """
    problem = feature_problem("hierarchical compilation")
    if problem is not None:
        raise TorchkilnError(problem)
    if inspect.ismethod(fn):
        # A bound method would bake one instance into the shared region.
        raise TorchkilnError("mark_nested needs the class's forward function, not a bound method")
    return torch.compiler.nested_compile_region(fn)


@hookimpl
def prepare_group(plan: RegionPlan, group: RegionGroup) -> GroupPreparation | None:
    """Mark the group's nested blocks with ``nested_compile_region`` (hierarchical plans)."""
    if plan.selector != NAME or not group.nested:
        return None
    marked_by_class: dict[type, Callable[..., Any]] = {}
    forwards = []
    for nested_group in group.nested:
        for region in nested_group.regions:
            cls = type(region.module)
            if cls not in marked_by_class:
                marked_by_class[cls] = mark_nested(cls.forward)
            # functools.partial, not types.MethodType: with a bound method torch 2.13 reuses
            # the nested subgraph with the *previous* layer's weights from the third block on
            # (silently wrong outputs); a partial keeps each call site's own parameters.
            forwards.append((region.module, functools.partial(marked_by_class[cls], region.module)))
    return GroupPreparation(forwards=tuple(forwards))


@hookimpl
def select_regions(model: nn.Module, config: CompileConfig) -> RegionPlan:
    """The root as the one compiled region, the repeated blocks as nested regions."""
    # A torch without nested_compile_region is refused when the configuration is read
    # (ConfigError at $.regions.strategy, naming the release), before selection.
    repeated = select_with(model, config, "repeated")
    nested = repeated.groups
    check_not_nested(nested)
    root_name = type(model).__name__
    if nested:
        counts = ", ".join(f"{len(g.regions)}x {g.name}" for g in nested)
        reason = (
            f"hierarchical: whole model as one graph; nested_compile_region on the repeated "
            f"blocks ({counts})"
        )
    else:
        reason = (
            "hierarchical: no repeated blocks found; the whole model is compiled as one graph "
            "with nothing nested (the same as regions.strategy=whole)"
        )
    root = RegionGroup(root_name, (Region("", model, root_name),), reason, nested=nested)
    return RegionPlan(NAME, (root,), reason=reason)


def check_not_nested(groups: tuple[RegionGroup, ...] | list[RegionGroup]) -> None:
    """Refuse nested regions that contain one another.

    :raises NestedRegionError: naming both regions and what to change.
    """
    regions = [region for group in groups for region in group.regions]
    owner_of = {id(region.module): region for region in regions}
    for outer in regions:
        for inner_module in outer.module.modules():
            inner = owner_of.get(id(inner_module))
            if inner is None or inner_module is outer.module:
                continue
            raise NestedRegionError(
                f"hierarchical: nested region {outer.display_path!r} "
                f"({type(outer.module).__name__}) contains nested region "
                f"{inner.display_path!r} ({type(inner_module).__name__}); a "
                "nested_compile_region inside another one is refused (it can silently "
                "compute wrong results upstream). Narrow regions.classes, or drop one of them "
                "with regions.exclude."
            )
