"""One store (``store=DIR``): where everything a run compiles lands, and what it implies.

``store`` fills the settings it subsumes when they are not set themselves: ``cache_dir`` is
``DIR/kernels``, ``job.store`` is ``DIR`` (its entries under ``DIR/entries``), and tiered
compilation is on, so that the whole-model form lands in ``DIR/whole`` once a builder finishes.
A value set explicitly, from any source, wins; the derived ones name the store as their source.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from torchkiln._internals.versions import feature_problem
from torchkiln.configuration.config import CompileConfig

KERNELS = "kernels"
"""``cache_dir`` inside a store: inductor's FX-graph and AOTAutograd caches."""
WHOLE = "whole"
"""Whole-model forms inside a store, one directory per model key."""
DEFAULT = "default"


def expand_store(
    config: CompileConfig, sources: Mapping[str, str]
) -> tuple[CompileConfig, dict[str, str]]:
    """``config`` with the values ``store`` implies, and their sources."""
    expanded = dict(sources)
    if config.store is None:
        return config, expanded
    root = Path(config.store).expanduser()
    origin = f"store ({sources.get('store', 'argument')})"  # the source of an implied value
    changes: dict[str, Any] = {}
    if config.cache_dir is None:
        changes["cache_dir"] = str(root / KERNELS)
        expanded["cache_dir"] = origin
    if config.job.store is None:
        changes["job"] = attrs.evolve(config.job, store=str(root))
        expanded["job.store"] = origin
    tiered_unset = sources.get("tiered.enabled", DEFAULT) == DEFAULT
    if tiered_unset and config.enabled and feature_problem("tiered compilation") is None:
        changes["tiered"] = attrs.evolve(config.tiered, enabled=True)
        expanded["tiered.enabled"] = origin
    return attrs.evolve(config, **changes), expanded


def tiers_implied(sources: Mapping[str, str]) -> bool:
    """Whether tiered compilation is on only because a store is set (then a plan the tiers
    cannot build on turns them off instead of raising)."""
    return sources.get("tiered.enabled", DEFAULT).startswith("store (")
