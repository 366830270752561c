"""The guards a region group's saved function keeps (a store or peer entry, an entry
``torchkiln.precompile`` writes).

Given no filter, torch's ``aot_compile`` drops every guard on a global and every guard whose
own type it cannot save (identity: ``ID_MATCH``, ``CLOSURE_MATCH``...), then refuses to save
a function holding a guard that is *derived* from one it cannot save. diffusers' attention
blocks trace three such guards, all on the attention processor's class (its ``__call__`` and
that function's code object, an ``ID_MATCH`` underneath): so their groups could not be stored
at all (``PackageError: ID_MATCH guard cannot be serialized``).

:class:`SavedGuardFilter` keeps torch's default and also drops a guard torch cannot save that
checks what a class holds, reached through ``type()`` of the region, a submodule or an object
one holds (``dict(type(module._modules['attn'].processor).__dict__)['__call__']``). The key
covers what it checked: its code hash reads the source files of the classes of the region's
modules and of the objects they hold (:func:`torchkiln.artifacts.directory.code_hash`), and
the guard on the object's type, which torch saves, stays: another processor class does not
fit. What is given up is what torch's own default gives up for globals: a class's function
replaced at run time (monkeypatched) is not noticed by the saved function.
docs/jobs.md, "What a saved function checks".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from torchkiln._internals import inductor
from torchkiln._internals.cache_entries import guard_type_of, kept_by_aot_compile, unsavable_guard
from torchkiln.configuration.config import CompileConfig

GuardFilterFn = Callable[[list[Any]], list[bool]]

TORCH_DEFAULT = "torch's default (a global, or a type torch cannot save)"
ON_A_CLASS = "on a class the key's code hash covers"


class SavedGuardFilter:
    """``guard_filter_fn`` for a group function compiled to be saved (the module docstring);
    ``inner``: the user's own ``guard_filter_fn``, whose verdicts count too (it then stands in
    for torch's default, as it would without torchkiln)."""

    def __init__(self, inner: GuardFilterFn | None = None):
        self.inner = inner
        self.dropped: dict[str, int] = {}
        """How many guards were dropped, by :data:`TORCH_DEFAULT` and :data:`ON_A_CLASS`."""

    def __call__(self, entries: list[Any]) -> list[bool]:
        keep = [self._keep(entry) for entry in entries]
        if self.inner is not None:
            keep = [ours and theirs for ours, theirs in zip(keep, self.inner(entries), strict=True)]
        return keep

    def _keep(self, entry: Any) -> bool:
        if self.inner is None and not kept_by_aot_compile(entry):
            return self._drop(TORCH_DEFAULT)
        if unsavable_guard(entry) and guard_type_of(entry.name) is not None:
            return self._drop(ON_A_CLASS)
        return True

    def _drop(self, why: str) -> bool:
        self.dropped[why] = self.dropped.get(why, 0) + 1
        return False

    def __deepcopy__(self, memo: dict[int, Any]) -> SavedGuardFilter:
        return self  # in a configuration a copied model shares


def saving_config(config: CompileConfig, dynamic: bool | None = None) -> CompileConfig:
    """The configuration a group function is compiled under to be saved: ``fullgraph=True``
    (``aot_compile`` refuses graph breaks), ``dynamic`` when given, and a
    :class:`SavedGuardFilter` as the ``guard_filter_fn`` option.

    ``torch.compile`` takes a ``mode`` or ``options``, not both; for inductor a ``mode`` becomes
    the settings it stands for (what ``torch.compile`` applies for it). A ``mode`` for another
    backend leaves torch's default filter (such a group's save fails as it did before).
    """
    dynamic = config.dynamic if dynamic is None else dynamic
    options, mode = dict(config.options), config.mode
    if mode is not None and config.backend != "inductor":
        return attrs.evolve(config, fullgraph=True, dynamic=dynamic)
    if mode is not None:
        options = {**inductor.mode_options(mode, dynamic), **options}
    options["guard_filter_fn"] = SavedGuardFilter(options.get("guard_filter_fn"))
    return attrs.evolve(config, fullgraph=True, dynamic=dynamic, mode=None, options=options)
