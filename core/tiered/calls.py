"""What the regional tier observes of the model's calls, so the builder compiles for them.

A call's *kind* (grad mode, train/eval) and the structure of its arguments (every tensor's
path, rank and dtype, every other leaf) make its *family*; a dimension whose size differed
between two calls of a family is compiled dynamic, the others static (docs/tiered.md, "What
happens, call by call").
"""

from __future__ import annotations

from typing import Any

import attrs
import torch
from torch import nn

from torchkiln.artifacts.whole_build import walk
from torchkiln.tiered.weightless import dumps_weightless


def _structure_of(leaf: Any) -> Any:
    if isinstance(leaf, torch.Tensor):
        return ("tensor", leaf.dim(), leaf.dtype, leaf.device.type, leaf.requires_grad)
    return leaf


@attrs.frozen
class CallSpec:
    """One observed call, without its values."""

    training: bool
    grad: bool
    structure: tuple[Any, ...]
    sizes: tuple[tuple[str, tuple[int, ...]], ...]

    @property
    def family(self) -> tuple[Any, ...]:
        return (self.training, self.grad, self.structure)

    @property
    def kind(self) -> str:
        return "training" if self.grad else "inference"


def call_spec(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CallSpec:
    leaves = list(walk((args, kwargs), "", 0))
    structure = tuple((path, _structure_of(leaf)) for path, leaf in leaves)
    sizes = tuple(
        (path, tuple(leaf.shape)) for path, leaf in leaves if isinstance(leaf, torch.Tensor)
    )
    return CallSpec(model.training, torch.is_grad_enabled(), structure, sizes)


def dynamic_dims(specs: list[CallSpec]) -> dict[str, tuple[int, ...]]:
    """Tensor path -> the dimensions whose size differed between ``specs`` (one family)."""
    first = dict(specs[0].sizes)
    varying: dict[str, set[int]] = {}
    for spec in specs[1:]:
        for path, shape in spec.sizes:
            for dim, (a, b) in enumerate(zip(first[path], shape, strict=True)):
                if a != b:
                    varying.setdefault(path, set()).add(dim)
    return {path: tuple(sorted(dims)) for path, dims in varying.items()}


@attrs.define
class CallLog:
    """The calls the regional tier saw before it asked for a build.

    ``ready()`` says when what was seen is enough to build: a second call of a family, the same
    (a loop) or with other sizes (one change is evidence that a size varies, as for torch's
    automatic dynamic shapes), or :attr:`limit` calls in all.
    """

    limit: int = 4
    closed: bool = False
    """Whether observing is over (the log was ready, hit its limit, or met a call it cannot
    describe); after that only :func:`covered` is asked of a call."""
    specs: list[CallSpec] = attrs.Factory(list)
    calls: list[bytes] = attrs.Factory(list)
    """Each call's ``(args, kwargs)``, pickled weightless when seen: a KV cache is the same object
    call after call, grown in place, so it is captured at the call it belongs to."""

    def add(self, spec: CallSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.specs.append(spec)
        self.calls.append(dumps_weightless((args, kwargs)))

    def ready(self) -> bool:
        last = self.specs[-1]  # a call repeated exactly is one of its family too
        return len(self.specs) >= self.limit or any(
            s.family == last.family for s in self.specs[:-1]
        )

    def families(self) -> list[tuple[CallSpec, int, dict[str, tuple[int, ...]]]]:
        """Per family: the spec and index of the call to compile from, and its dynamic dims."""
        grouped: dict[tuple[Any, ...], list[int]] = {}
        for index, spec in enumerate(self.specs):
            grouped.setdefault(spec.family, []).append(index)
        result = []
        for indexes in grouped.values():
            specs = [self.specs[i] for i in indexes]
            result.append((specs[-1], indexes[-1], dynamic_dims(specs)))
        return result


def covered(spec: CallSpec, families: list[Any], every_size_dynamic: bool = False) -> bool:
    """Whether a build for ``families`` compiled a call like ``spec``: one of them is its
    family, and its sizes differ from that family's only in dimensions compiled dynamic (all of
    them with ``every_size_dynamic``: ``compile(dynamic=True)``)."""
    for built, _, dims in families:
        if built.family != spec.family:
            continue
        if every_size_dynamic:
            return True
        sizes = dict(built.sizes)
        return all(
            all(
                a == b or dim in dims.get(path, ())
                for dim, (a, b) in enumerate(zip(sizes[path], shape, strict=True))
            )
            for path, shape in spec.sizes
        )
    return False


def family_shapes(families: list[Any]) -> list[Any]:
    """What a build compiles for: each family's spec and dynamic dims (not which call)."""
    return [(spec, dims) for spec, _, dims in families]


def describe_families(families: list[Any]) -> str:
    """``2 kinds of call (inference, sizes fixed; inference, dynamic sizes)``."""
    parts = [
        f"{spec.kind}, {'dynamic sizes' if dims else 'sizes fixed'}" for spec, _, dims in families
    ]
    noun = "kind of call" if len(parts) == 1 else "kinds of call"
    return f"{len(parts)} {noun} ({'; '.join(parts)})"
