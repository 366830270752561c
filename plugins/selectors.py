"""Built-in plugin: the selectors ``auto``, ``repeated``, ``whole``, ``classes`` and
``paths``.

``repeated`` finds blocks anywhere in the tree: the classes a model names itself
(transformers' ``_no_split_modules``, diffusers' ``_repeated_blocks``) or ``regions.classes``
when given, otherwise any class that appears ``regions.min_repeats`` or more times among the
children of one module, looking through ``nn.ModuleList``, ``nn.Sequential`` and
``nn.ModuleDict`` (nested ones too). Regions are grouped by exact class: one compiled function
per group.
"""

from __future__ import annotations

import fnmatch
from collections import Counter
from collections.abc import Iterable, Iterator

from torch import nn

from torchkiln.plugin import (
    CompileConfig,
    EagerPart,
    Region,
    RegionGroup,
    RegionPlan,
    SelectorSpec,
    hookimpl,
)

CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)


@hookimpl
def declare_selectors() -> list[SelectorSpec]:
    return [
        SelectorSpec("auto", "repeated blocks when the model has them, else the whole model"),
        SelectorSpec("repeated", "every repeated block, one compiled function per block class"),
        SelectorSpec("whole", "the whole model as one region"),
        SelectorSpec("classes", "modules whose class name matches regions.classes globs"),
        SelectorSpec("paths", "modules whose dotted path matches regions.paths globs"),
    ]


@hookimpl
def select_regions(model: nn.Module, config: CompileConfig, selector: str) -> RegionPlan | None:
    if selector == "auto":
        return _auto(model, config)
    if selector == "repeated":
        return _repeated_plan(model, config, requested="repeated")
    if selector == "whole":
        return whole_plan(model, "whole model, as configured (regions.strategy=whole)")
    if selector == "classes":
        return _plan_from(
            model,
            config,
            "classes",
            _by_class(model, config.regions.classes),
            f"modules whose class matches {', '.join(config.regions.classes)}",
        )
    if selector == "paths":
        return _plan_from(
            model,
            config,
            "paths",
            _by_path(model, config.regions.paths),
            f"modules whose path matches {', '.join(config.regions.paths)}",
        )
    return None


# --- strategies ------------------------------------------------------------------------------


def whole_plan(model: nn.Module, reason: str, requested: str = "") -> RegionPlan:
    group = RegionGroup(type(model).__name__, (Region("", model, type(model).__name__),), reason)
    return RegionPlan("whole", (group,), reason=reason, requested=requested)


def _auto(model: nn.Module, config: CompileConfig) -> RegionPlan:
    plan = _repeated_plan(model, config, requested="auto")
    if plan.groups:
        return plan
    return whole_plan(
        model,
        f"auto: no repeated blocks found (no class appears {config.regions.min_repeats}+ times "
        "among a module's children, and the model names no block classes); compiling the whole "
        "model as one region",
        requested="auto",
    )


def _repeated_plan(model: nn.Module, config: CompileConfig, requested: str) -> RegionPlan:
    groups = find_repeated_groups(model, config)
    if not groups:
        return RegionPlan(
            "repeated",
            (),
            eager=(EagerPart("", "no repeated blocks found"),),
            reason="repeated: no repeated blocks found; nothing is compiled",
            requested=requested,
        )
    counts = ", ".join(f"{len(g.regions)}x {g.name}" for g in groups)
    reason = f"{requested}: repeated blocks found: {counts}"
    return _finish(model, config, "repeated", groups, reason, requested)


def _plan_from(
    model: nn.Module,
    config: CompileConfig,
    selector: str,
    modules: list[tuple[str, nn.Module]],
    why: str,
) -> RegionPlan:
    groups = group_by_class(_drop_excluded(modules, config), why)
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


# --- finding blocks --------------------------------------------------------------------------


def find_repeated_groups(model: nn.Module, config: CompileConfig) -> list[RegionGroup]:
    """Repeated blocks, grouped by exact class, outermost first; excluded paths dropped."""
    hints = model_block_hints(model) | set(config.regions.classes)
    if hints:
        found = _by_class(model, tuple(hints))
        why = "named as a block class (" + ", ".join(sorted(hints)) + ")"
        if found:
            return group_by_class(_drop_excluded(found, config), why)
    found = list(_structural_blocks(model, "", config.regions.min_repeats))
    return group_by_class(_drop_excluded(found, config), "repeated among siblings")


def model_block_hints(model: nn.Module) -> set[str]:
    """Block class names the model declares (transformers and diffusers conventions)."""
    hints: set[str] = set()
    for attribute in ("_no_split_modules", "_repeated_blocks"):
        value = getattr(model, attribute, None)
        if isinstance(value, str):
            hints.add(value)
        elif isinstance(value, Iterable):
            hints.update(v for v in value if isinstance(v, str))
    return hints


def _children_through_containers(
    module: nn.Module, prefix: str, in_container: bool = False
) -> Iterator[tuple[str, nn.Module]]:
    """Direct children, with containers (and containers inside them) looked through. An
    ``nn.Sequential`` that is an item of a container is a candidate block like any module (it is
    callable: ``ModuleList([Sequential(Linear, GELU, Linear), ...])``); one held as a plain
    attribute (``self.layers = nn.Sequential(*blocks)``) is a container."""
    in_container = in_container or isinstance(module, CONTAINERS)
    for name, child in module.named_children():
        path = f"{prefix}{name}"
        if isinstance(child, CONTAINERS) and not (
            in_container and isinstance(child, nn.Sequential)
        ):
            yield from _children_through_containers(child, path + ".", True)
        else:
            yield path, child


def _structural_blocks(
    module: nn.Module, prefix: str, min_repeats: int
) -> Iterator[tuple[str, nn.Module]]:
    children = list(_children_through_containers(module, prefix))
    counts = Counter(type(child) for _, child in children)
    for path, child in children:
        # A block is composite: repeated leaves (two nn.Linear) are layers, not blocks.
        repeated = (
            counts[type(child)] >= min_repeats
            and _has_parameters(child)
            and next(child.children(), None) is not None
        )
        if repeated and not _is_stack(module, prefix, path, child, min_repeats):
            yield path, child
        else:
            yield from _structural_blocks(child, path + ".", min_repeats)


def _is_stack(
    parent: nn.Module, prefix: str, path: str, child: nn.Module, min_repeats: int
) -> bool:
    """Same-class siblings held as plain attributes (an encoder and a decoder of one class), or
    ``nn.Sequential`` items of a container, that each hold a list of repeated composite blocks
    are stacks: their blocks are the regions. Other siblings held in a container (decoder
    layers, even with a list of experts inside) are blocks."""
    in_container = isinstance(parent, CONTAINERS) or "." in path[len(prefix) :]
    if in_container and not isinstance(child, nn.Sequential):
        return False
    return _holds_block_list(child, min_repeats)


def _holds_block_list(module: nn.Module, min_repeats: int) -> bool:
    """A container inside ``module`` holds ``min_repeats`` same-class composite blocks (modules
    with parameters and children; a ``Sequential(Linear, GELU, Linear)`` holds none)."""
    for sub in module.modules():
        if isinstance(sub, CONTAINERS):
            counts = Counter(
                type(c) for c in sub.children() if _has_parameters(c) and next(c.children(), None)
            )
            if any(n >= min_repeats for n in counts.values()):
                return True
    return False


def _has_parameters(module: nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def _outermost(matches: Iterable[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module]]:
    selected: list[tuple[str, nn.Module]] = []
    for path, module in matches:
        if not any(path == p or path.startswith(p + ".") or not p for p, _ in selected):
            selected.append((path, module))
    return selected


def _class_matches(module: nn.Module, patterns: Iterable[str]) -> bool:
    cls = type(module)
    names = (cls.__name__, f"{cls.__module__}.{cls.__qualname__}")
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns for name in names)


def _by_class(model: nn.Module, patterns: tuple[str, ...]) -> list[tuple[str, nn.Module]]:
    return _outermost((p, m) for p, m in model.named_modules() if _class_matches(m, patterns))


def _by_path(model: nn.Module, patterns: tuple[str, ...]) -> list[tuple[str, nn.Module]]:
    return _outermost(
        (p, m)
        for p, m in model.named_modules()
        if any(fnmatch.fnmatchcase(p, pat) for pat in patterns)
    )


def _drop_excluded(
    found: list[tuple[str, nn.Module]], config: CompileConfig
) -> list[tuple[str, nn.Module]]:
    patterns = config.regions.exclude
    return [(p, m) for p, m in found if not _excluded(p, patterns)]


def _excluded(path: str, patterns: tuple[str, ...]) -> bool:
    """``path`` or one of its ancestors matches: an excluded module's subtree is excluded too
    (``rest=leaves`` must not compile the leaves inside an excluded block)."""
    parts = path.split(".")
    ancestors = [".".join(parts[: i + 1]) for i in range(len(parts))]
    return any(fnmatch.fnmatchcase(a, pat) for a in ancestors for pat in patterns)


def group_by_class(found: list[tuple[str, nn.Module]], reason: str) -> list[RegionGroup]:
    """One group per exact class; same-named classes from different modules get suffixes."""
    by_class: dict[type, list[tuple[str, nn.Module]]] = {}
    for path, module in found:
        by_class.setdefault(type(module), []).append((path, module))
    groups = []
    used: Counter[str] = Counter()
    for cls, members in by_class.items():
        used[cls.__name__] += 1
        name = cls.__name__ if used[cls.__name__] == 1 else f"{cls.__name__}_{used[cls.__name__]}"
        regions = tuple(Region(path, module, name) for path, module in members)
        groups.append(RegionGroup(name, regions, f"{reason}: {len(regions)}x {cls.__name__}"))
    return groups


def _leaf_groups(
    model: nn.Module, groups: list[RegionGroup], config: CompileConfig
) -> list[RegionGroup]:
    """``regions.rest=leaves``: each parameterised leaf outside the blocks, grouped by class."""
    taken = [r.path for g in groups for r in g.regions]
    leaves = [
        (path, module)
        for path, module in model.named_modules()
        if path
        and not any(True for _ in module.children())
        and _has_parameters(module)
        and not any(path == t or path.startswith(t + ".") for t in taken)
    ]
    found = group_by_class(
        _drop_excluded(leaves, config), "leaf outside the blocks (regions.rest=leaves)"
    )
    names = {g.name for g in groups}
    return [
        RegionGroup(
            g.name if g.name not in names else f"{g.name}_leaf",
            tuple(
                Region(r.path, r.module, g.name if g.name not in names else f"{g.name}_leaf")
                for r in g.regions
            ),
            g.reason,
        )
        for g in found
    ]


def eager_parts(
    model: nn.Module, groups: list[RegionGroup], config: CompileConfig
) -> list[EagerPart]:
    """The largest subtrees holding no region: what runs eagerly, and why."""
    taken = [r.path for g in groups for r in g.regions]
    if "" in taken:
        return []
    parts: list[EagerPart] = []

    def visit(module: nn.Module, prefix: str) -> None:
        for name, child in module.named_children():
            path = f"{prefix}{name}"
            if path in taken:
                continue
            if any(t.startswith(path + ".") for t in taken):
                visit(child, path + ".")
            elif _has_parameters(child) or any(True for _ in child.children()):
                excluded = any(fnmatch.fnmatchcase(path, p) for p in config.regions.exclude)
                parts.append(
                    EagerPart(
                        path,
                        "excluded (regions.exclude)"
                        if excluded
                        else f"outside the selected regions (regions.rest={config.regions.rest})",
                    )
                )

    visit(model, "")
    return parts
