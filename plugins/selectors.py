"""Built-in plugin: the selectors ``auto``, ``repeated``, ``whole``, ``classes`` and
``paths``.

``repeated`` plans at the level that really repeats. A region group is a set of
*structurally identical* modules (:mod:`torchkiln.engine.structure`), so each group compiles
into one graph. Walking down from the root, the first composite module whose shape occurs
``regions.min_repeats`` or more times is a block; a module whose shape is unique is looked
into, so the largest level that repeats wins. Singletons stay with the rest of the model.
The model's own block names (transformers' ``_no_split_modules``, diffusers'
``_repeated_blocks``) are hints that the plan's reason compares with the level chosen.
``regions.classes``, when given, is the user's level, grouped by shape. docs/guide.md ("How
``repeated`` (and ``auto``) find blocks") says how stacks and rare shapes are looked into.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from torchkiln.plugin import (
    CompileConfig,
    EagerPart,
    Region,
    RegionGroup,
    RegionPlan,
    SelectorSpec,
    drop_excluded,
    group_by_structure,
    hookimpl,
)
from torchkiln.plugins.block_levels import LevelChoice, by_class, by_path, choose_level
from torchkiln.plugins.plan_notes import (
    eager_parts,
    has_own_forward,
    has_parameters,
    poor_plan_note,
    self_and_ancestors,
)

DESCRIPTIONS = {
    "auto": "repeated blocks when the model has them, else the whole model",
    "repeated": "the largest repeated blocks, one compiled function per block shape",
    "whole": "the whole model as one region",
    "classes": "modules whose class name matches regions.classes globs",
    "paths": "modules whose dotted path matches regions.paths globs",
}


@hookimpl
def declare_selectors() -> list[SelectorSpec]:
    # None of them takes regions.options.
    return [SelectorSpec(name, about, options=()) for name, about in DESCRIPTIONS.items()]


@hookimpl
def select_regions(model: nn.Module, config: CompileConfig, selector: str) -> RegionPlan:
    # torchkiln calls this only for the names declared above.
    return SELECTORS[selector](model, config)


def _matching(model: nn.Module, config: CompileConfig, selector: str) -> RegionPlan:
    """``classes`` or ``paths``: the modules whose class name or path matches the globs."""
    what, find, patterns = {
        "classes": ("class", by_class, config.regions.classes),
        "paths": ("path", by_path, config.regions.paths),
    }[selector]
    why = f"modules whose {what} matches {', '.join(patterns)}"
    return _plan_from(model, config, selector, find(model, patterns), why)


def whole_plan(model: nn.Module, reason: str, requested: str = "") -> RegionPlan:
    group = RegionGroup(type(model).__name__, (Region("", model, type(model).__name__),), reason)
    return RegionPlan("whole", (group,), reason=reason, requested=requested)


def _auto(model: nn.Module, config: CompileConfig) -> RegionPlan:
    choice = choose_level(model, config)
    if choice.groups:
        return _repeated_plan(model, config, "auto", choice)
    return whole_plan(
        model,
        f"auto: no repeated blocks found ({_nothing_repeats(config, choice)}); compiling the "
        "whole model as one region",
        requested="auto",
    )


def _nothing_repeats(config: CompileConfig, choice: LevelChoice) -> str:
    why = f"no composite module's shape occurs {config.regions.min_repeats}+ times"
    return f"{why}; {choice.level}" if choice.level else why


def _repeated_plan(
    model: nn.Module, config: CompileConfig, requested: str, choice: LevelChoice | None = None
) -> RegionPlan:
    choice = choice or choose_level(model, config)
    groups = choice.groups
    if not groups:
        return RegionPlan(
            "repeated",
            (),
            eager=(EagerPart("", "no repeated blocks found"),),
            reason=(
                f"repeated: no repeated blocks found ({_nothing_repeats(config, choice)}); "
                "nothing is compiled"
            ),
            requested=requested,
        )
    counts = ", ".join(f"{len(g.regions)}x {g.name}" for g in groups)
    reason = f"{requested}: repeated blocks found: {counts}; {choice.level}"
    poor = poor_plan_note(model, groups, config.regions.min_repeats)
    if poor:
        reason += f"; {poor}"
    return _finish(model, config, "repeated", groups, reason, requested)


def _plan_from(
    model: nn.Module,
    config: CompileConfig,
    selector: str,
    modules: list[tuple[str, nn.Module]],
    why: str,
) -> RegionPlan:
    callable_modules = [(path, module) for path, module in modules if has_own_forward(module)]
    groups = group_by_structure(drop_excluded(callable_modules, config.regions.exclude), why)
    reason = (
        f"{selector}: {why}: {sum(len(g.regions) for g in groups)} regions"
        if groups
        else f"{selector}: nothing matched ({why})"
    )
    return _finish(model, config, selector, groups, reason, selector)


def _finish(
    model: nn.Module,
    config: CompileConfig,
    selector: str,
    groups: list[RegionGroup],
    reason: str,
    requested: str,
) -> RegionPlan:
    if config.regions.rest == "leaves":
        groups = groups + _leaf_groups(model, groups, config)
    return RegionPlan(
        selector,
        tuple(groups),
        eager=tuple(eager_parts(model, groups, config)),
        reason=reason,
        requested=requested if requested != selector else "",
    )


def _leaf_groups(
    model: nn.Module, groups: list[RegionGroup], config: CompileConfig
) -> list[RegionGroup]:
    """``regions.rest=leaves``: each parameterised leaf outside the blocks that has a forward
    (a parameter dict is read by its parent's forward, never called), grouped by class."""
    taken = {r.path for g in groups for r in g.regions}
    leaves = [
        (path, module)
        for path, module in model.named_modules()
        if path
        and not any(True for _ in module.children())
        and has_parameters(module)
        and has_own_forward(module)
        and not any(prefix in taken for prefix in self_and_ancestors(path))
    ]
    found = group_by_structure(
        drop_excluded(leaves, config.regions.exclude),
        "leaf outside the blocks (regions.rest=leaves)",
    )
    taken_names = {g.name for g in groups}
    renamed = []
    for g in found:
        name = g.name if g.name not in taken_names else f"{g.name}_leaf"
        regions = tuple(Region(r.path, r.module, name) for r in g.regions)
        renamed.append(RegionGroup(name, regions, g.reason))
    return renamed


SELECTORS: dict[str, Callable[[nn.Module, CompileConfig], RegionPlan]] = {
    "auto": _auto,
    "repeated": lambda model, config: _repeated_plan(model, config, requested="repeated"),
    "whole": lambda model, config: whole_plan(
        model, "whole model, as configured (regions.strategy=whole)"
    ),
    "classes": lambda model, config: _matching(model, config, "classes"),
    "paths": lambda model, config: _matching(model, config, "paths"),
}
