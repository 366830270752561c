"""Check a selector's plan against the model before anything is touched.

Every check here runs in :func:`torchkiln.compile` (and :func:`torchkiln.plan`) right after
``select_regions`` returns, so a bad plan is refused with nothing changed, with every problem
found (the first few) in one :class:`PluginError` naming the selector's plugin. The group
invariant (one ``forward`` function per group) comes from :mod:`torchkiln.engine.structure`, whose
``check_plan`` / ``check_group`` selector authors call in their own tests.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from torch import nn

from torchkiln.engine.resolve import ResolvedConfig
from torchkiln.engine.structure import forward_code_problems, uncallable_regions
from torchkiln.errors import PluginError
from torchkiln.plugin_host.plugin_faults import bad_result, call_hook
from torchkiln.plugin_host.plugin_manager import PluginManager
from torchkiln.plugin_host.region_plan import EagerPart, Region, RegionGroup, RegionPlan
from torchkiln.plugin_host.selection import planning_with

logger = logging.getLogger("torchkiln")

_SHOWN = 5


def answered(pm: PluginManager, hook: str, owner: str | None, name: str, **kwargs: Any) -> Any:
    """What ``hook`` answered for the strategy or selector ``name`` (:func:`call_hook`; ``owner``
    declared it); no answer is a :class:`PluginError`."""
    result = call_hook(pm, hook, owner, **kwargs)
    if result is None:
        declared_by = f" (declared by plugin {owner!r}, which returned None)" if owner else ""
        raise PluginError(
            f"no plugin answered {hook} for strategy {name!r}{declared_by}", plugin=owner, hook=hook
        )
    return result


def select_plan(model: nn.Module, resolved: ResolvedConfig, pm: PluginManager) -> RegionPlan:
    """The checked plan of the selector ``resolved`` names (``select_regions``), logged: what
    :func:`torchkiln.plan` returns and :func:`torchkiln.compile` and :func:`torchkiln.precompile`
    compile."""
    config = resolved.config
    selector = config.regions.strategy
    declared = pm.selectors().get(selector)
    owner = declared.plugin if declared is not None else None
    with planning_with(pm):
        plan = answered(
            pm, "select_regions", owner, selector, model=model, config=config, selector=selector
        )
    plan = check_plan(plan, model, owner)
    # A fallback to the whole model, or a plan that compiles nothing, is never silent.
    fell_back = plan.selector != selector and plan.selector == "whole"
    level = logging.WARNING if fell_back or not plan.groups else logging.INFO
    logger.log(level, "%s", plan.reason or f"selected {plan.region_count} regions")
    return plan


def check_plan(plan: Any, model: nn.Module, plugin: str | None) -> RegionPlan:
    """``plan`` if it is a valid plan for ``model``, else :class:`PluginError` naming
    ``plugin`` (the selector's) and every problem found (the first few)."""
    if not isinstance(plan, RegionPlan):
        raise bad_result("select_regions", plugin, plan, "a torchkiln.RegionPlan")
    problems = [
        *_shape_problems(plan),
        *_group_problems(plan.groups, model, "group"),
        *_group_problems(plan.nested, model, "nested group"),
    ]
    if problems:
        more = f" (and {len(problems) - _SHOWN} more)" if len(problems) > _SHOWN else ""
        who = f"selector plugin {plugin!r}" if plugin else "the selector"
        raise PluginError(
            f"{who}: select_regions() returned a plan for selector {plan.selector!r} that does "
            f"not fit the model: {'; '.join(problems[:_SHOWN])}{more}",
            plugin=plugin,
            hook="select_regions",
        )
    return plan


def _shape_problems(plan: RegionPlan) -> Iterable[str]:
    for field, kind in (("groups", RegionGroup), ("nested", RegionGroup), ("eager", EagerPart)):
        value = getattr(plan, field)
        if not isinstance(value, tuple | list) or not all(isinstance(v, kind) for v in value):
            yield f"plan.{field} must be a tuple of {kind.__name__}"
    for group in (*_groups(plan.groups), *_groups(plan.nested)):
        if not isinstance(group.regions, tuple | list) or not all(
            isinstance(r, Region) for r in group.regions
        ):
            yield f"group {group.name!r}: regions must be a tuple of Region"


def _groups(groups: Any) -> list[RegionGroup]:
    if not isinstance(groups, tuple | list):
        return []
    return [g for g in groups if isinstance(g, RegionGroup)]


def _group_problems(groups: Any, model: nn.Module, kind: str) -> Iterable[str]:
    names: set[str] = set()
    seen: dict[int, str] = {}
    for group in _groups(groups):
        if group.name in names:
            yield f"two {kind}s are named {group.name!r}"
        names.add(group.name)
        regions = (
            [r for r in group.regions if isinstance(r, Region)]
            if isinstance(group.regions, tuple | list)
            else []
        )
        if not regions:
            yield f"{kind} {group.name!r} has no regions"
        elif len(regions) == len(group.regions):
            yield from uncallable_regions(group)
            if kind == "group":
                # The regions of a group share one compiled function: one forward for all.
                yield from forward_code_problems(group)
        for region in regions:
            where = region.path or "<root>"
            if region.group != group.name:
                yield f"region {where} names group {region.group!r} but is in {group.name!r}"
            try:
                module = model.get_submodule(region.path)
            except AttributeError:
                yield f"{where} is not a submodule of the model"
                continue
            if region.module is not module:
                yield f"{where}: the plan's module is not the model's module at that path"
            if id(module) in seen:
                yield f"{where} is listed twice (also as {seen[id(module)]})"
            seen[id(module)] = where
