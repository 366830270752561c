"""How the built-in selectors find blocks (:mod:`torchkiln.plugins.selectors`): the level that
really repeats, the model's own block names as hints, and class and path patterns.

A helper module of the built-in plugins, not a plugin itself.
"""

from __future__ import annotations

import fnmatch
from collections import Counter
from collections.abc import Iterable, Iterator

import attrs
from torch import nn

from torchkiln._internals.diffusers import repeated_blocks
from torchkiln._internals.transformers import no_split_modules
from torchkiln.plugin import (
    CompileConfig,
    RegionGroup,
    StructureIndex,
    difference_kind,
    drop_excluded,
    group_by_structure,
)
from torchkiln.plugins.plan_notes import (
    CONTAINERS,
    has_parameters,
    instances_by_class,
    poor_plan_note,
)


@attrs.frozen
class LevelChoice:
    """The repeated blocks found, and why that level (for the plan's reason)."""

    groups: list[RegionGroup]
    level: str
    """Why this level, in one clause (``level: LlamaDecoderLayer, the largest modules that
    repeat``)."""


def choose_level(model: nn.Module, config: CompileConfig) -> LevelChoice:
    """The largest modules that really repeat (see the module docstring)."""
    search = _LevelSearch(model, config)
    if config.regions.classes:
        found = drop_excluded(by_class(model, config.regions.classes), config.regions.exclude)
        if found:
            return search.from_classes(found)
    return search.largest_repeated()


class _LevelSearch:
    def __init__(self, model: nn.Module, config: CompileConfig) -> None:
        self.model = model
        self.min_repeats = config.regions.min_repeats
        self.exclude = config.regions.exclude
        self.index = StructureIndex()
        self.hints = model_block_hints(model)
        modules = [m for _, m in model.named_modules()][1:]
        self.counts = Counter(self.index.key(m) for m in modules)
        self.instances = instances_by_class(model)
        self.rejected: set[str] = set()

    # -- the two ways in --

    def from_classes(self, found: list[tuple[str, nn.Module]]) -> LevelChoice:
        """``regions.classes`` given to ``repeated``: the user's level, grouped by shape."""
        groups = self._group(found, "named in regions.classes")
        kept = [g for g in groups if len(g.regions) >= self.min_repeats]
        names = ", ".join(dict.fromkeys(type(m).__name__ for _, m in found))
        level = f"level: {names}, as regions.classes names"
        dropped = [g for g in groups if len(g.regions) < self.min_repeats]
        if dropped:
            level += (
                f"; {sum(len(g.regions) for g in dropped)} of their instances have a shape "
                f"that occurs fewer than {self.min_repeats} times and stay with the rest"
            )
        return LevelChoice(kept, level)

    def largest_repeated(self) -> LevelChoice:
        declared = self.declared_level()
        if declared is not None:
            return declared
        found = self._search(coarsen=False)
        if poor_plan_note(self.model, self._group(found, ""), self.min_repeats):
            # Many small groups: try again without the small pieces of units that differ.
            self.rejected = set()
            found = self._search(coarsen=True)
        # The level is chosen on the whole model; regions.exclude then drops regions from it.
        groups = self._group(drop_excluded(found, self.exclude), "")
        return LevelChoice(groups, self._level(groups) if groups else self._no_level())

    def _search(self, coarsen: bool) -> list[tuple[str, nn.Module]]:
        while True:
            found = list(self._walk(self.model, "", set()))
            if coarsen:
                found = self._coarsen(found)
            groups = self._group(found, "")
            small = [g for g in groups if len(g.regions) < self.min_repeats]
            if not small:
                return found
            # Their other occurrences are inside chosen blocks: look inside these instead.
            self.rejected.update(r.path for g in small for r in g.regions)

    def declared_level(self) -> LevelChoice | None:
        """diffusers' ``_repeated_blocks``: the model's own "compile these" list. It is the
        level when, checked against the structure, its classes are blocks of this model that
        occur ``min_repeats``+ times in all; every instance is compiled (one group per shape,
        a shape occurring once included, as diffusers' own ``compile_repeated_blocks`` does)."""
        names = _names(repeated_blocks(self.model))
        if not names:
            return None
        found = _outermost(
            (path, module)
            for path, module in self.model.named_modules()
            if path and type(module).__name__ in names and _is_block(module)
        )
        if len(found) < self.min_repeats:
            return None
        groups = self._group(drop_excluded(found, self.exclude), "")
        if not groups:
            return None
        shapes = ", ".join(f"{len(g.regions)}x {g.name}" for g in groups)
        level = (
            f"level: {', '.join(sorted(names & {g.module_class.__name__ for g in groups}))}, "
            f"as the model's _repeated_blocks names ({shapes})"
        )
        return LevelChoice(groups, level)

    def _coarsen(self, found: list[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module]]:
        """For a poor plan (:func:`poor_plan_note`): small regions inside an instance of a
        chosen block class that is not a region itself
        (EfficientNet's InvertedResidual of a shape of its own, SD3's last
        JointTransformerBlock) are dropped: compiling that unit's pieces one by one costs a
        graph and a call per piece for little work each, and leaves most of the unit eager
        anyway. The unit stays eager as a whole, with the reason its shape differs."""
        chosen = {type(module) for _, module in found}
        regions = {path for path, _ in found}
        dropped: set[str] = set()
        for unit_path, unit in self.model.named_modules():
            if not unit_path or type(unit) not in chosen or unit_path in regions:
                continue
            pieces = [p for p, _ in found if p.startswith(unit_path + ".")]
            covered = sum(_parameter_count(self.model.get_submodule(p)) for p in pieces)
            # Pieces holding most of the unit's weights (ModernBERT's attention and MLP in a
            # layer of its own) are worth compiling; small ones (norms, a squeeze-excite) are not.
            if pieces and 2 * covered < _parameter_count(unit):
                dropped.update(pieces)
        return [(path, module) for path, module in found if path not in dropped]

    # -- search --

    def _walk(
        self, module: nn.Module, prefix: str, seen: set[int]
    ) -> Iterator[tuple[str, nn.Module]]:
        for name, child in module.named_children():
            path = f"{prefix}{name}"
            if id(child) in seen:
                continue
            seen.add(id(child))
            if self._is_region(module, path, child):
                yield path, child
            else:
                yield from self._walk(child, path + ".", seen)

    def _is_region(self, parent: nn.Module, path: str, child: nn.Module) -> bool:
        return (
            path not in self.rejected
            and _is_block(child)
            and self.counts[self.index.key(child)] >= self.min_repeats
            and not self._is_stack(parent, child)
        )

    def _is_stack(self, parent: nn.Module, child: nn.Module) -> bool:
        """Identical modules held as plain attributes (an encoder and a decoder of one class),
        or ``nn.Sequential`` items of a container, that each hold a list of repeated blocks
        are stacks: their blocks repeat more, so they are the regions. Items of a container
        (decoder layers, even with a list of identical experts inside) are blocks."""
        if isinstance(parent, CONTAINERS) and not isinstance(child, nn.Sequential):
            return False
        for sub in child.modules():
            if isinstance(sub, CONTAINERS):
                keys = Counter(self.index.key(c) for c in sub.children() if _is_block(c))
                if any(n >= self.min_repeats for n in keys.values()):
                    return True
        return False

    def _group(self, found: list[tuple[str, nn.Module]], why: str) -> list[RegionGroup]:
        def reason(members: list[tuple[str, nn.Module]]) -> str:
            cls = type(members[0][1]).__name__
            hinted = " (a block class the model names)" if cls in self.hints else ""
            text = f"{len(members)}x {cls}, structurally identical{hinted}"
            return f"{why}: {text}" if why else text

        return group_by_structure(found, reason, self.index)

    # -- explaining the level --

    def _level(self, groups: list[RegionGroup]) -> str:
        classes = list(dict.fromkeys(g.module_class for g in groups))
        chosen = {c.__name__ for c in classes}
        names = ", ".join(c.__name__ for c in classes)
        coarser = self._coarser_notes(groups)
        mentioned = {note.split(":")[0].removeprefix("not ") for note in coarser}
        notes = [*coarser, *self._hint_notes(groups, chosen | mentioned)]
        shapes = len(groups)
        per_class = "" if shapes == len(classes) else f" ({shapes} shapes)"
        level = f"level: {names}{per_class}, the largest modules that repeat"
        return level + (f" ({'; '.join(notes)})" if notes else "")

    def _no_level(self) -> str:
        """Why nothing repeats: classes with several block instances that all differ."""
        notes = []
        for cls, instances in self.instances.items():
            blocks = [m for m in instances if _is_block(m)]
            if len(blocks) >= self.min_repeats and not isinstance(blocks[0], CONTAINERS):
                why = difference_kind(blocks[0], blocks[1]) or "their contents"
                notes.append(f"{cls.__name__}: {len(blocks)} instances, all different ({why})")
        return "; ".join(notes[:3])

    def _coarser_notes(self, groups: list[RegionGroup]) -> list[str]:
        """Classes above the chosen blocks with several instances, none repeating."""
        regions = {id(r.module) for g in groups for r in g.regions}
        chosen = {g.module_class for g in groups}
        notes = []
        for cls, instances in self.instances.items():
            if len(instances) < 2 or cls in chosen:
                continue
            if isinstance(instances[0], CONTAINERS) or not _is_block(instances[0]):
                continue
            holds = [m for m in instances if any(id(s) in regions for s in m.modules())]
            if len(holds) < 2:
                continue
            shapes = len({self.index.key(m) for m in holds})
            why = difference_kind(holds[0], holds[1]) or "their contents"
            if shapes == len(holds):
                notes.append(f"not {cls.__name__}: its {len(holds)} instances all differ ({why})")
            else:
                notes.append(
                    f"not {cls.__name__}: {len(holds)} instances in {shapes} shapes ({why}); "
                    "its blocks repeat more"
                )
        return notes

    def _hint_notes(self, groups: list[RegionGroup], chosen_names: set[str]) -> list[str]:
        inside = {id(s) for g in groups for r in g.regions for s in r.module.modules()}
        notes = []
        for hint in sorted(self.hints - chosen_names):
            instances = [
                m for cls, ms in self.instances.items() if cls.__name__ == hint for m in ms
            ]
            if not instances:
                continue
            if len(instances) == 1:
                notes.append(f"the model's hint {hint} occurs once, so it is not a block")
            elif all(id(m) in inside for m in instances):
                notes.append(f"the model's hint {hint} is inside the chosen blocks")
            else:
                shapes = len({self.index.key(m) for m in instances})
                notes.append(
                    f"the model's hint {hint}: {len(instances)} instances in {shapes} shapes"
                )
        return notes


def _is_block(module: nn.Module) -> bool:
    """A candidate block: composite (children and parameters) and callable. Repeated leaves
    (two ``nn.Linear``) are layers, not blocks; ModuleList and ModuleDict have no forward."""
    return (
        not isinstance(module, nn.ModuleList | nn.ModuleDict)
        and next(module.children(), None) is not None
        and has_parameters(module)
    )


def model_block_hints(model: nn.Module) -> set[str]:
    """Block class names the model declares (transformers and diffusers conventions).

    They are hints: the plan uses the level that really repeats, and its reason says how the
    hints compare."""
    return _names(no_split_modules(model)) | _names(repeated_blocks(model))


def _names(value: object) -> set[str]:
    """Class names from a model attribute holding one name or a list of them."""
    if isinstance(value, str):
        return {value}
    if isinstance(value, Iterable):
        return {v for v in value if isinstance(v, str)}
    return set()


def _parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


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


def by_class(model: nn.Module, patterns: tuple[str, ...]) -> list[tuple[str, nn.Module]]:
    return _outermost((p, m) for p, m in model.named_modules() if _class_matches(m, patterns))


def by_path(model: nn.Module, patterns: tuple[str, ...]) -> list[tuple[str, nn.Module]]:
    return _outermost(
        (p, m)
        for p, m in model.named_modules()
        if any(fnmatch.fnmatchcase(p, pat) for pat in patterns)
    )
