"""What a plan says about itself: the parts that stay eager and why, and whether the plan is
worth compiling (helpers of the built-in selectors, :mod:`torchkiln.plugins.selectors`)."""

from __future__ import annotations

from torch import nn

from torchkiln.plugin import CompileConfig, EagerPart, RegionGroup, difference_kind, is_excluded

CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)


def has_parameters(module: nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def has_own_forward(module: nn.Module) -> bool:
    """Whether calling ``module`` runs a forward of its class. ``nn.ParameterDict``,
    ``nn.ParameterList`` and the module containers have none: they are never called, only read
    by their parent's forward, so a region of one would never run (PEFT's
    ``lora_embedding_A``/``lora_embedding_B`` are such dicts)."""
    return type(module).forward is not nn.Module.forward


NO_FORWARD = "no forward of its own: never called, its parameters are read by the forward of "
"""The reason a module with parameters but no forward stays eager (its parent is appended)."""


def self_and_ancestors(path: str) -> list[str]:
    """``a.b.c`` -> ``a``, ``a.b``, ``a.b.c``."""
    parts = path.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def instances_by_class(model: nn.Module) -> dict[type, list[nn.Module]]:
    """The model's submodules (the root left out) by class, in module order."""
    instances: dict[type, list[nn.Module]] = {}
    for _, module in list(model.named_modules())[1:]:
        instances.setdefault(type(module), []).append(module)
    return instances


POOR_PLAN_GROUPS = 5
"""A plan with this many groups or more, each of fewer than three regions on average, costs
about a graph per group for little reuse: :func:`poor_plan_note` says so."""


def poor_plan_note(model: nn.Module, groups: list[RegionGroup], min_repeats: int) -> str:
    """``""``, or why the plan is poor and what to try instead (a block class that holds the
    regions, or the whole model): many groups, few regions each, so about one graph per group
    where a whole-model compile needs one."""
    regions = sum(len(g.regions) for g in groups)
    if len(groups) < POOR_PLAN_GROUPS or regions >= 3 * len(groups):
        return ""
    inside = {id(r.module) for g in groups for r in g.regions}
    best, held = "", 0
    for cls, found in instances_by_class(model).items():
        if len(found) < min_repeats or isinstance(found[0], CONTAINERS):
            continue
        count = sum(1 for m in found for sub in m.modules() if id(sub) in inside)
        if count > held:
            best, held = cls.__name__, count
    hint = f"regions=classes:{best} or regions=whole" if best else "regions=whole"
    return (
        f"a poor plan: {len(groups)} groups for {regions} regions, about {len(groups)} graphs "
        f"where a whole-model compile needs 1: consider {hint}"
    )


def eager_parts(
    model: nn.Module, groups: list[RegionGroup], config: CompileConfig
) -> list[EagerPart]:
    """The largest subtrees holding no region: what runs eagerly, and why."""
    taken = {r.path for g in groups for r in g.regions}
    if "" in taken:
        return []
    # Sets, not lists: with thousands of regions a membership scan per module is quadratic.
    above = {ancestor for path in taken for ancestor in self_and_ancestors(path)} - taken
    parts: list[EagerPart] = []
    outside = f"outside the selected regions (regions.rest={config.regions.rest})"

    chosen = tuple({g.module_class for g in groups})

    def holds_chosen(module: nn.Module) -> bool:
        # A subtree holding a block of a chosen class is looked into: that block gets its own
        # line and its specific reason (EfficientNet's stage of InvertedResiduals that differ).
        return any(isinstance(m, chosen) for m in module.modules()) if chosen else False

    def visit(module: nn.Module, prefix: str, unit: str = "") -> None:
        for name, child in module.named_children():
            path = f"{prefix}{name}"
            if path in taken:
                continue
            if path in above or (not isinstance(child, chosen) and holds_chosen(child)):
                # Parts of a chosen-class block that is not a region (a shape of its own whose
                # smaller pieces are regions) say which block and why.
                own = _own_shape(child, groups) if isinstance(child, chosen) else ""
                visit(child, path + ".", f"part of {path}, {own}" if own else unit)
            elif has_parameters(child) or any(True for _ in child.children()):
                if is_excluded(path, config.regions.exclude):
                    parts.append(EagerPart(path, "excluded (regions.exclude)"))
                elif not has_own_forward(child) and not any(True for _ in child.children()):
                    parts.append(EagerPart(path, NO_FORWARD + (prefix.rstrip(".") or "<root>")))
                else:
                    parts.append(EagerPart(path, (_own_shape(child, groups) or unit) + outside))

    visit(model, "")
    return parts


def _own_shape(module: nn.Module, groups: list[RegionGroup]) -> str:
    """For a module of a chosen block class whose shape is not repeated (ResNet's first
    bottleneck of a stage, say): why it is not in that class's group, else ``""``."""
    for group in groups:
        if group.module_class is type(module):
            why = difference_kind(module, group.regions[0].module)
            if why is not None:
                return f"a shape of its own, not repeated (unlike group {group.name}: {why}); "
    return ""
