"""Structural identity of modules, exclusion by path, and the group invariant: helpers for
region selectors (docs/plugins/selector.md lists them and what counts as plain).

Two modules are *structurally identical* when Dynamo would trace them into the same graph with
the same guards: same class and ``forward`` function, submodule tree, parameter and buffer
shapes, dtypes, devices and ``requires_grad``, and plain attributes. Integer attributes that
number a block (:data:`INDEX_ATTRIBUTE`) are left out: they are traced as symbolic ints.
"""

from __future__ import annotations

import enum
import fnmatch
import re
import types
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from torchkiln._internals import accelerate
from torchkiln._internals.nn_module import own_buffers, own_parameters
from torchkiln.errors import PluginError
from torchkiln.plugin_host.region_plan import Region, RegionGroup, RegionPlan

INDEX_ATTRIBUTE = re.compile(r"^(?:(?:layer|block|stage)_?)?(?:idx|index|id|number|num)$")
"""Integer attributes with such names (``layer_idx``, ``layer_id``, ``block_index``,
``stage_idx``, ``layer_number``, ``idx``) number a block; they are not part of its structure.
Other ints (``padding_idx``, ``shift_size``) are."""

_MODULE_INTERNALS = frozenset(vars(nn.Module()))
"""Attributes every ``nn.Module`` instance has (``_parameters``, hook dicts...), ``training``
aside: their contents are compared through the parameters, buffers and children instead."""

# --- structural identity ---------------------------------------------------------------------


class StructureIndex:
    """Structural keys of a model's modules, computed once per module.

    >>> index = StructureIndex()
    >>> index.key(model.layers[0]) == index.key(model.layers[1])
    True

    Keys are small ints, equal exactly when the modules are structurally identical (within
    one index; keys of two indexes are not comparable).
    """

    def __init__(self) -> None:
        self._ids: dict[Hashable, int] = {}
        self._keys: dict[int, tuple[nn.Module, int]] = {}

    def key(self, module: nn.Module) -> int:
        cached = self._keys.get(id(module))
        if cached is not None and cached[0] is module:
            return cached[1]
        children = tuple((name, self.key(child)) for name, child in module.named_children())
        full = (tuple(_own_facts(module)), children)
        key = self._ids.setdefault(full, len(self._ids))
        self._keys[id(module)] = (module, key)  # the module is kept so its id stays unique
        return key


def structure_key(module: nn.Module) -> Hashable:
    """A hashable key, equal for structurally identical modules (see the module docstring).

    For many modules of one model, :class:`StructureIndex` is cheaper: it keys each submodule
    once.
    """
    return (
        tuple(_own_facts(module)),
        tuple((name, structure_key(child)) for name, child in module.named_children()),
    )


def same_structure(a: nn.Module, b: nn.Module) -> bool:
    return structural_difference(a, b) is None


def _own_facts(module: nn.Module) -> Iterator[tuple[str, Any]]:
    """What Dynamo sees of ``module`` itself (its children not included)."""
    yield "class", type(module)
    yield "forward", _forward_identity(module)
    for name, param in sorted(own_parameters(module).items()):
        yield f"parameter {name}", _tensor_facts(param)
    for name, buffer in sorted(own_buffers(module).items()):
        yield f"buffer {name}", _tensor_facts(buffer)
    for name, value in sorted(vars(module).items()):
        if name == "forward" or (name in _MODULE_INTERNALS and name != "training"):
            continue
        if name.startswith("_torchkiln"):
            continue
        if isinstance(value, int) and not isinstance(value, bool) and INDEX_ATTRIBUTE.search(name):
            continue  # numbers the block; traced as a symbolic int (see the module docstring)
        plain = _plain(value)
        if plain is not _NOT_PLAIN:
            # Keyed by name alone: an int 1 in one module and a float 1.0 in another is one
            # attribute with two values, not two attributes each absent from the other.
            yield f"attribute {name}", (name, plain, _kind(value))


def _forward_identity(module: nn.Module) -> Hashable:
    own = module.__dict__.get("forward")
    if own is None:
        return type(module).forward
    hook = accelerate.hook_of(module)
    if hook is not None:
        # Accelerate's hook wrapper is one partial per module: what it runs is the hook's kind
        # around the forward it wraps (plugins/accelerate_hooks.py runs both around the call).
        under = accelerate.forward_under_hook(module)
        return ("accelerate", type(hook), getattr(under, "__func__", under))
    function = getattr(own, "__func__", own)
    return ("instance", getattr(function, "__code__", id(function)))


def _tensor_facts(tensor: torch.Tensor | None) -> Hashable:
    if tensor is None:
        return None
    return (
        tuple(tensor.shape),
        tensor.dtype,
        tensor.device.type,
        bool(tensor.requires_grad),
        type(tensor),
    )


class _NotPlain(enum.Enum):
    NOT_PLAIN = "NOT_PLAIN"


_NOT_PLAIN = _NotPlain.NOT_PLAIN
_PLAIN_TYPES = (bool, int, float, str, bytes, type(None), torch.dtype, torch.device, enum.Enum)


def _plain(value: Any, depth: int = 0) -> Hashable:
    """``value`` as a hashable fact when Dynamo would specialise on it, else ``_NOT_PLAIN``."""
    if isinstance(value, _PLAIN_TYPES):
        return (type(value), value)
    if isinstance(value, types.FunctionType | types.BuiltinFunctionType):
        return ("function", value)
    if isinstance(value, torch.Tensor):
        return ("tensor", _tensor_facts(value))
    if isinstance(value, tuple | list) and depth < 3:
        items = tuple(_plain(item, depth + 1) for item in value)
        return _NOT_PLAIN if _NOT_PLAIN in items else (type(value), items)
    return _NOT_PLAIN


def _kind(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, tuple | list):
        return "tuple"
    if isinstance(value, torch.Tensor):
        return "tensor"
    if isinstance(value, types.FunctionType | types.BuiltinFunctionType):
        return "function"
    return type(value).__name__


def flat_facts(module: nn.Module) -> dict[str, Hashable]:
    """Every fact of ``module`` and its submodules, by ``"<path>: <what>"``."""
    facts: dict[str, Hashable] = {}
    for path, sub in module.named_modules(remove_duplicate=False):
        prefix = path or "<self>"
        facts[f"{prefix}: children"] = tuple(name for name, _ in sub.named_children())
        for what, value in _own_facts(sub):
            facts[f"{prefix}: {what}"] = value
    return facts


def structural_difference(a: nn.Module, b: nn.Module) -> str | None:
    """The first difference between two modules' structures, in words; ``None`` if none.

    ``"drop_path: float attribute drop_prob: 0.0 vs 0.1"``,
    ``"layer_scale_parameter: parameter shape (96,) vs (192,)"``...
    """
    first, second = flat_facts(a), flat_facts(b)
    for name in [*first, *(n for n in second if n not in first)]:
        one, other = first.get(name, _NOT_PLAIN), second.get(name, _NOT_PLAIN)
        if one != other:
            if name.endswith("children") and isinstance(one, tuple) and isinstance(other, tuple):
                return f"{name}: {_show_children(one, other)}"
            if " attribute " in f" {name.split(': ', 1)[-1]}":
                return _attribute_difference(name, one, other)
            return f"{name}: {_show(one)} vs {_show(other)}"
    return None


def _attribute_difference(name: str, one: Hashable, other: Hashable) -> str:
    """``drop_path: float attribute drop_prob: 0.0 vs 0.1``; with kinds that differ,
    ``<self>: attribute scale: float 1.0 vs int 1``."""
    where, attribute = name.split(": ", 1)
    kinds = [fact[2] if isinstance(fact, tuple) else None for fact in (one, other)]
    present = [k for k in kinds if k is not None]
    if len(set(present)) > 1:
        shown = " vs ".join(f"{k} {_show(f)}" for k, f in zip(kinds, (one, other), strict=True))
        return f"{where}: {attribute}: {shown}"
    return f"{where}: {present[0]} {attribute}: {_show(one)} vs {_show(other)}"


def _show_children(one: tuple[str, ...], other: tuple[str, ...]) -> str:
    """Which submodules one has and the other lacks (``children: ff_context, norm2_context
    absent``), else the two lists."""
    missing = [name for name in one if name not in other]
    extra = [name for name in other if name not in one]
    if not missing and not extra:
        return f"{one!r} vs {other!r}"
    return f"{', '.join(missing) or 'absent'} vs {', '.join(extra) or 'absent'}"


def difference_kind(a: nn.Module, b: nn.Module) -> str | None:
    """What tells ``a`` and ``b`` apart, in a few words (``float attribute
    drop_path.drop_prob``, ``parameter shapes``, ``class of drop_path``, ``submodules of
    layers``); ``None`` if they are identical."""
    difference = structural_difference(a, b)
    if difference is None:
        return None
    where, what = difference.split(": ", 2)[:2]
    inside = "" if where == "<self>" else where
    if what.startswith(("parameter", "buffer")):
        return f"{what.split(' ')[0]} shapes"
    if " attribute " in what:
        kind, name = what.split(" attribute ", 1)
        return f"{kind} attribute {inside + '.' if inside else ''}{name}"
    if what.startswith("attribute "):  # an attribute whose kind differs
        name = what.removeprefix("attribute ")
        return f"attribute {inside + '.' if inside else ''}{name}"
    if what == "children":
        names = sorted({*difference.split(": ", 2)[2].split(" vs ")} - {"absent"})
        named = all(n.isidentifier() for n in names)  # ff_context, not list items 3 or ('0',)
        what = f"submodules ({', '.join(names)})" if named and names else "submodules"
        return what.replace("submodules", f"submodules of {inside}", 1) if inside else what
    return f"{what} of {inside}" if inside else what


def _show(value: Hashable) -> str:
    if value is None or value is _NOT_PLAIN:
        return "absent"
    if isinstance(value, tuple) and len(value) == 3 and isinstance(value[0], str):
        value = value[1]  # (name, plain, kind)
    if isinstance(value, tuple) and len(value) == 5 and isinstance(value[0], tuple):
        shape, dtype, device, grad, _ = value
        return f"{tuple(shape)} {str(dtype).removeprefix('torch.')} {device}" + (
            "" if grad else " frozen"
        )
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], type):
        return repr(value[1])
    if isinstance(value, type | types.FunctionType):
        return value.__qualname__
    return repr(value)


# --- exclusion -------------------------------------------------------------------------------


def is_excluded(path: str, patterns: Iterable[str]) -> bool:
    """``path`` or one of its ancestors matches one of the ``fnmatch`` globs ``patterns``.

    A module under an excluded one is excluded too: excluding ``model.layers.1`` keeps
    ``model.layers.1.mlp`` eager as well.
    """
    patterns = tuple(patterns)
    if not patterns:
        return False
    parts = path.split(".")
    ancestors = [".".join(parts[: i + 1]) for i in range(len(parts))]
    return any(fnmatch.fnmatchcase(a, pattern) for a in ancestors for pattern in patterns)


def drop_excluded(
    found: Iterable[tuple[str, nn.Module]], patterns: Iterable[str]
) -> list[tuple[str, nn.Module]]:
    """``found`` without the modules :func:`is_excluded` by ``patterns``."""
    patterns = tuple(patterns)
    return [(path, module) for path, module in found if not is_excluded(path, patterns)]


# --- grouping --------------------------------------------------------------------------------


def group_by_structure(
    found: Sequence[tuple[str, nn.Module]],
    reason: str | Callable[[list[tuple[str, nn.Module]]], str],
    index: StructureIndex | None = None,
) -> list[RegionGroup]:
    """One group per structural key, in order of first appearance.

    A group is named after its class; a class with several shapes (or a class name used by two
    libraries) gets ``_2``, ``_3``... on the later groups. ``reason`` is a group's reason, or a
    function of its members that returns it.
    """
    index = index or StructureIndex()
    by_key: dict[int, list[tuple[str, nn.Module]]] = {}
    for path, module in found:
        by_key.setdefault(index.key(module), []).append((path, module))
    groups = []
    used: Counter[str] = Counter()
    for members in by_key.values():
        cls_name = type(members[0][1]).__name__
        used[cls_name] += 1
        name = cls_name if used[cls_name] == 1 else f"{cls_name}_{used[cls_name]}"
        why = reason(members) if callable(reason) else reason
        regions = tuple(Region(path, module, name) for path, module in members)
        groups.append(RegionGroup(name, regions, why))
    return groups


# --- the group invariant ---------------------------------------------------------------------


def forward_code_problems(group: RegionGroup) -> list[str]:
    """What breaks "one ``forward`` function per group" in ``group``, one line each (empty:
    nothing). The regions of a group share one compiled function, the first region's class
    ``forward``: a member whose class has another ``forward`` would silently run that code."""
    if not group.regions:
        return []
    first = group.regions[0]
    forward = type(first.module).forward
    return [
        f"modules with different forward code in group {group.name!r}: "
        f"{first.display_path!r} ({_qualname(type(first.module))}) and "
        f"{region.display_path!r} ({_qualname(type(region.module))})"
        for region in group.regions
        if type(region.module).forward is not forward
    ]


def uncallable_regions(group: RegionGroup) -> list[str]:
    """Regions of ``group`` whose class has no ``forward`` (``nn.ParameterDict``, a
    ``ModuleList``), one line each: nothing ever calls them, so they would never compile nor
    run, and the report would say ``pending`` for ever."""
    return [
        f"{region.display_path!r} ({_qualname(type(region.module))}) has no forward of its own: "
        "nothing calls it, so as a region it would never compile nor run"
        for region in group.regions
        if type(region.module).forward is nn.Module.forward
    ]


def check_group(group: RegionGroup, *, plugin: str = "") -> None:
    """Refuse a group whose regions do not all run one ``forward`` function
    (:func:`forward_code_problems`), has no regions, holds a module with no ``forward``
    (:func:`uncallable_regions`), or whose regions name another group.

    :param plugin: the plugin that made the group, named in the error.
    :raises PluginError: naming the plugin, the group and the two regions that differ.
    """
    who = f"selector plugin {plugin!r}" if plugin else "the selector"
    if not group.regions:
        raise PluginError(f"{who} returned group {group.name!r} with no regions")
    for region in group.regions:
        if region.group != group.name:
            raise PluginError(
                f"{who}: region {region.display_path!r} is in group {group.name!r} but says "
                f"group {region.group!r}; Region.group must name the group that holds it"
            )
    uncallable = uncallable_regions(group)
    if uncallable:
        raise PluginError(f"{who} selected a region that is never called: {uncallable[0]}")
    problems = forward_code_problems(group)
    if problems:
        raise PluginError(
            f"{who} put {problems[0]}; the regions of a group share one compiled function, so "
            "each group must hold modules whose class forward is the same function (group by "
            "class, or with torchkiln.plugin.group_by_structure)"
        )


def check_plan(plan: RegionPlan, root: nn.Module, *, plugin: str = "") -> None:
    """Check every group of ``plan`` (:func:`check_group`), that each region's path names its
    module in ``root``, that group names are unique and that no module is in two regions.

    :raises PluginError: naming ``plugin`` and what is wrong.
    """
    who = f"selector plugin {plugin!r}" if plugin else "the selector"
    names: set[str] = set()
    owner: dict[int, str] = {}
    for group in plan.groups:
        if group.name in names:
            raise PluginError(f"{who} returned two groups named {group.name!r}")
        names.add(group.name)
        check_group(group, plugin=plugin)
        for region in group.regions:
            try:
                module = root.get_submodule(region.path) if region.path else root
            except AttributeError:
                module = None
            if module is not region.module:
                raise PluginError(
                    f"{who}: region {region.display_path!r} of group {group.name!r} is not "
                    f"the module at that path in the model (Region.path must be the module's "
                    "dotted path from the root, as named_modules() gives it)"
                )
            if id(module) in owner:
                raise PluginError(
                    f"{who}: module {region.display_path!r} is in two regions (groups "
                    f"{owner[id(module)]!r} and {group.name!r})"
                )
            owner[id(module)] = group.name


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"
