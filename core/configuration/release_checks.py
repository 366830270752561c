"""Configuration checks against the installed torch: a feature this release lacks is refused
when the configuration is read, naming the feature, the setting and the release, so that it
never ends in an internal error in the middle of a call, nor in a silent eager run."""

from __future__ import annotations

from collections.abc import Mapping

from torchkiln._internals.versions import feature_problem
from torchkiln.configuration.config import CompileConfig
from torchkiln.errors import ConfigProblem


def configured_features(config: CompileConfig) -> dict[str, str]:
    """The version-gated features ``config`` asks for: feature name -> the setting asking."""
    wanted: dict[str, str] = {}
    if config.tiered.enabled:
        wanted["tiered compilation"] = "tiered.enabled"
    if config.artifacts is not None:
        wanted["precompiled artifacts"] = "artifacts"
    if config.regions.strategy == "hierarchical":
        wanted["hierarchical compilation"] = "regions.strategy"
    return wanted


def release_problems(config: CompileConfig, sources: Mapping[str, str]) -> list[ConfigProblem]:
    """One problem per configured feature that the installed torch cannot run."""
    problems = []
    for feature, setting in configured_features(config).items():
        reason = feature_problem(feature)
        if reason is not None:
            problems.append(ConfigProblem(f"$.{setting}", reason, sources.get(setting, "")))
    return problems
