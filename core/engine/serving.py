"""Serving mode: :func:`freeze`, after which Dynamo compiles nothing for the model.

An inference server warms its calls up, then freezes: from then on every call runs a compiled
form the model already holds (a region group's code, a loaded entry, the whole-model form), and
a call none fits either raises :class:`~torchkiln.errors.UncoveredCallError` naming the region
and the failing guard (``on_miss="raise"``) or runs that region eagerly, with one warning per
group (``on_miss="eager"``). A compile in the middle of serving would stall one rank past the
collective watchdog; a frozen model never starts one. docs/serving.md shows it.

Each region's runtime keeps its ``forward``; freezing changes only what serves its calls
(:class:`FrozenRun`), under torch's own stance for the job (``fail_on_recompile`` or
``eager_on_recompile``), so Dynamo itself refuses to compile a frame.
"""

from __future__ import annotations

import warnings
from typing import Any

import attrs
import torch
from torch import nn

from torchkiln._internals import cache_entries, dynamo
from torchkiln.engine.compile_state import REGION_ATTR, CompileState, RegionState
from torchkiln.engine.region_runtime import RegionRuntime, eager_forward
from torchkiln.errors import ConfigError, ConfigProblem, UncoveredCallError

ON_MISS = ("raise", "eager")
STANCES = {"raise": "fail_on_recompile", "eager": "eager_on_recompile"}


class UncoveredCallWarning(RuntimeWarning):
    """A frozen model ran a region eagerly: no compiled form fit the call (``on_miss="eager"``)."""


@attrs.define
class Freeze:
    """A frozen model's policy, shared by its regions and group codes."""

    on_miss: str
    warned: set[str] = attrs.Factory(set)
    """Groups already warned about (``eager``: one warning per group)."""
    uncovered_calls: dict[str, int] = attrs.Factory(dict)
    """Group -> calls no compiled form fit since the freeze (run eagerly, or refused)."""

    def line(self) -> str:
        """The report's line: ``frozen (on_miss='raise'): 2 region calls no compiled form
        covered (LlamaDecoderLayer 2)``."""
        total = sum(self.uncovered_calls.values())
        calls = "region call" if total == 1 else "region calls"
        groups = ", ".join(f"{group} {count}" for group, count in self.uncovered_calls.items())
        by_group = f" ({groups})" if groups else ""
        return (
            f"frozen (on_miss={self.on_miss!r}): {total} {calls} no compiled form covered{by_group}"
        )

    def uncovered(
        self,
        region_state: RegionState,
        guards: list[str],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """A call of ``region_state``'s region that no compiled form fits: raise, or run it
        eagerly (warned once per group)."""
        self.count(region_state)
        if self.on_miss == "raise":
            raise UncoveredCallError(where(region_state), guards)
        self.ran_eagerly(region_state, guards)
        return eager_forward(region_state.module, *args, **kwargs)

    def count(self, region_state: RegionState) -> None:
        """One more call of the region's group that no compiled form covered."""
        group = region_state.region.group
        self.uncovered_calls[group] = self.uncovered_calls.get(group, 0) + 1

    def ran_eagerly(self, region_state: RegionState, guards: list[str]) -> None:
        group = region_state.region.group
        if group in self.warned:
            return
        self.warned.add(group)
        failed = f": {'; '.join(guards)}" if guards else ""
        warnings.warn(
            f"torchkiln: frozen model: {where(region_state)} ran eagerly, no compiled form "
            f"covers the call{failed} (one warning per group)",
            UncoveredCallWarning,
            stacklevel=4,
        )


def where(region_state: RegionState) -> str:
    region = region_state.region
    return f"region {region.display_path!r} (group {region.group!r})"


class FrozenRun:
    """What serves a frozen region's calls: its code under the freeze's stance."""

    def __init__(self, inner: Any, policy: Freeze):
        self.inner = inner
        """What served the region before the freeze (``None``: it had no call yet)."""
        self.policy = policy
        self.stance = STANCES[policy.on_miss]

    def __call__(self, module: nn.Module, /, *args: Any, **kwargs: Any) -> Any:
        region_state: RegionState = module.__dict__[REGION_ATTR]
        if self.inner is None:
            return self.policy.uncovered(
                region_state, ["the region had no call before the freeze"], args, kwargs
            )
        if self.inner is eager_forward:  # it fell back to eager before: nothing to compile
            return eager_forward(module, *args, **kwargs)
        eager_before = region_state.eager_calls
        with torch.compiler.set_stance(self.stance):
            try:
                output = self.inner(module, *args, **kwargs)
            except RuntimeError as error:
                guards = dynamo.recompile_refusal(error)
                if guards is None:
                    raise
                self.policy.count(region_state)
                raise UncoveredCallError(where(region_state), guards) from None
        if region_state.eager_calls != eager_before:  # Dynamo ran it eagerly: uncovered
            self.policy.count(region_state)
            first = region_state.first_eager
            self.policy.ran_eagerly(region_state, list(first.failed_guards) if first else [])
        return output


def call_families(state: CompileState) -> tuple[str, ...]:
    """What each compiled form admits, read from its guards (one family per compiled entry):
    ``LlamaDecoderLayer (compiled): args[0] float32[1, 8, 256] | args[0] float32[*, 8, 256]``,
    per group and for the whole-model form."""
    lines = []
    for group, code in state.codes.items():
        families = cache_entries.dynamo_guard_table(code, lambda entry: entry).covered_calls()
        if families:
            lines.append(f"{group} (compiled): {' | '.join(families)}")
        group_code = state.group_codes.get(group)
        if group_code is not None and group_code.loaded is not None:
            loaded = " | ".join(group_code.covered_calls())
            lines.append(f"{group} (from {group_code.loaded.source}): {loaded}")
    form = getattr(state.tiered, "form", None)
    if form is not None:
        lines.append(f"whole model: {' | '.join(form.covered_calls())}")
    return tuple(lines)


def freeze_state(state: CompileState, on_miss: str) -> Freeze:
    """Freeze every region, group code and the tiers of one compile."""
    if on_miss not in ON_MISS:
        raise ConfigError(
            [
                ConfigProblem(
                    "freeze(on_miss)", f"got {on_miss!r}; allowed: {', '.join(map(repr, ON_MISS))}"
                )
            ]
        )
    policy = Freeze(on_miss)
    state.frozen = policy
    if state.tiered is not None:
        state.tiered.freeze()
    for code in state.group_codes.values():
        code.frozen = policy
    for region_state in state.regions:
        runtime = region_state.module.__dict__.get("forward")
        if isinstance(runtime, RegionRuntime) and runtime.region_state is region_state:
            inner = runtime.run.inner if isinstance(runtime.run, FrozenRun) else runtime.run
            runtime.run = FrozenRun(inner, policy)
    return policy
