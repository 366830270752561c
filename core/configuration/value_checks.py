"""Semantic checks on a structured :class:`CompileConfig`, whatever its sources: choices,
ranges, paths, names the plugins declare and what they accept, features the installed torch
lacks, DeepSpeed settings that import modules. Types are checked by :mod:`.config_validation`,
``options`` by :mod:`.option_safety`.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from torchkiln._internals.versions import feature_problem
from torchkiln.configuration.config import (
    FLOAT_DTYPES,
    JOB_SHARE_CHOICES,
    PROGRESS_CHOICES,
    REGION_ERROR_POLICIES,
    REST_POLICIES,
    TIERED_WHEN_CHOICES,
    CompileConfig,
)
from torchkiln.configuration.config_sources import dollar
from torchkiln.configuration.config_values import INT64_MAX, describe, did_you_mean
from torchkiln.configuration.option_safety import is_untrusted, option_problems
from torchkiln.errors import ConfigError, ConfigProblem

_CHOICES = (
    ("on_region_error", REGION_ERROR_POLICIES, "a region error policy"),
    ("regions.rest", REST_POLICIES, "a rest policy"),
    ("progress", PROGRESS_CHOICES, "a progress setting"),
    ("tiered.when", TIERED_WHEN_CHOICES, "a tiered.when setting"),
    ("job.share", JOB_SHARE_CHOICES, "a job.share setting"),
    *(
        (f"distributed.fsdp2.mixed_precision.{name}", FLOAT_DTYPES, "a floating-point dtype name")
        for name in ("param_dtype", "reduce_dtype", "output_dtype")
    ),
)
"""Fields that take one of a fixed set of values (``None`` is left to the field's type)."""

TIERED_STRATEGIES = ("none", "ddp")
"""Distributed strategies tiered compilation runs under: the whole-model form replaces the
forward that DDP calls; FSDP2 and DeepSpeed shard parameters per block, which one whole-model
graph built from an unsharded copy would not reproduce."""

VERSION_GATED = (
    ("tiered compilation", "tiered.enabled", lambda config: config.tiered.enabled),
    ("precompiled artifacts", "artifacts", lambda config: config.artifacts is not None),
    (
        "hierarchical compilation",
        "regions.strategy",
        lambda c: c.regions.strategy == "hierarchical",
    ),
)
"""Features a torch release may lack: feature name, the setting asking for it, whether it does."""

REMOTE_CACHE_SCHEMES = ("redis", "rediss", "unix")


_Add = Callable[..., None]
"""``add(path, message, source=None)`` in :func:`check`."""


def _field(config: CompileConfig, path: str) -> Any:
    return functools.reduce(getattr, path.split("."), config)


def check(config: CompileConfig, sources: Mapping[str, str], plugins: Any) -> None:
    """Semantic checks against the registered plugins; raises one ConfigError."""
    problems: list[ConfigProblem] = []

    def add(path: str, message: str | None, source: str | None = None) -> None:
        """A problem at ``$.path`` when there is a ``message``, from the source of the field
        ``source`` (default: ``path``)."""
        if message:
            problems.append(ConfigProblem(dollar(path), message, sources.get(source or path, "")))

    for path, allowed, what in _CHOICES:
        if _field(config, path) is not None:
            add(path, _choice(_field(config, path), allowed, what))
    if config.remote_cache is not None:
        add("remote_cache", remote_cache_problem(config.remote_cache))
    if not 0 < config.job.timeout <= 7 * 24 * 3600:
        add("job.timeout", f"{config.job.timeout} is not between 0 (exclusive) and 604800 seconds")
    for path in ("regions.min_repeats", "distributed.fsdp2.replicate_degree"):
        value = _field(config, path)
        if value < 1:
            add(path, f"{value} must be at least 1")
        elif value > INT64_MAX:
            add(path, f"{describe(value)} is too large; at most {INT64_MAX}")
    _check_tiered(config, add)
    for feature, path, wanted in VERSION_GATED:
        if wanted(config):
            add(path, feature_problem(feature))
    missing_hint = plugins.missing_hint()
    selectors, strategies = plugins.selectors(), plugins.distributed_strategies()
    selector = selectors.get(config.regions.strategy)
    strategy = strategies.get(config.distributed.strategy)
    choice = _choice(config.regions.strategy, selectors, "a declared selector", missing_hint)
    add("regions.strategy", choice)
    what = "a declared distributed strategy"
    add(
        "distributed.strategy", _choice(config.distributed.strategy, strategies, what, missing_hint)
    )
    # A declared name whose plugin lacks the hook that serves it is refused like an unknown one.
    if selector is not None:
        add("regions.strategy", plugins.unserved(selector))
    if strategy is not None:
        add("distributed.strategy", plugins.unserved(strategy))
    if selector is not None:
        owner = f"selector {config.regions.strategy!r}"
        _check_options(add, owner, "regions.options", config.regions.options, selector.spec.options)
    for name, glob in (("classes", "class-name"), ("paths", "module-path")):
        if config.regions.strategy == name and not getattr(config.regions, name):
            add(
                f"regions.{name}",
                f"strategy {name!r} needs at least one {glob} glob in regions.{name}",
            )
    if config.mode is not None and config.options:
        add(
            "mode",
            f"mode {describe(config.mode)} and options {describe(list(config.options))} cannot both be set "
            "(torch.compile takes one or the other); put the mode's settings into options instead",
        )
    add("distributed.ddp.bucket_cap_mb", _positive_size(config.distributed.ddp.bucket_cap_mb))
    add("cache_dir", _cache_dir(config.cache_dir))
    add("store", _cache_dir(config.store, "store"))
    add("distributed.deepspeed.config", _deepspeed_imports(config, sources))
    if config.backend != "no":
        _check_backend(config, plugins, add)
    problems.extend(option_problems(config, sources))
    if strategy is not None:
        availability = strategy.spec.probe()
        if not availability.available:
            add(
                "distributed.strategy",
                f"{describe(config.distributed.strategy)} is not available: {availability.reason}",
            )
    if problems:
        raise ConfigError(problems)


def _choice(
    config_value: Any, allowed: Iterable[str], what: str, missing_hint: str = ""
) -> str | None:
    allowed = sorted(allowed)
    if config_value in allowed:
        return None
    hint = did_you_mean(str(config_value), allowed)
    return (
        f"{describe(config_value)} is not {what}{hint}; allowed: {', '.join(allowed)}{missing_hint}"
    )


def _check_options(
    add: _Add, owner: str, field: str, given: Iterable[str], accepted: tuple[str, ...] | None
) -> None:
    """A problem for each key of ``given`` that ``accepted`` (``None``: any) lacks."""
    allowed = ", ".join(accepted or ()) or "none"
    for key in given:
        if accepted is not None and key not in accepted:
            hint = did_you_mean(key, accepted)
            add(
                f"{field}.{key}",
                f"{owner} does not accept option {describe(key)}{hint}; allowed: {allowed}",
                field,
            )


def _check_tiered(config: CompileConfig, add: _Add) -> None:
    tiered = config.tiered
    for name, value, low, high in (
        ("threads", tiered.threads, 1, 256),
        ("nice", tiered.nice, 0, 19),
    ):
        if not low <= value <= high:
            add(f"tiered.{name}", f"{value} is not between {low} and {high}")
    bound = tiered.max_slowdown
    if bound != 0 and not 1 < bound <= 100:
        add(
            "tiered.max_slowdown",
            f"{bound} is neither 0 (no bound) nor a ratio above 1 and at most 100 (1.25: "
            "the builder may make the mean step at most 25% slower)",
        )
    strategy = config.distributed.strategy
    if tiered.enabled and strategy not in TIERED_STRATEGIES:
        add(
            "tiered.enabled",
            f"tiered compilation is not supported with distributed strategy {strategy!r} "
            f"(allowed: {', '.join(TIERED_STRATEGIES)}): it shards parameters per block, "
            "and a whole-model graph built from an unsharded copy would not gather them",
        )


def _check_backend(config: CompileConfig, plugins: Any, add: _Add) -> None:
    found = plugins.backend(config.backend)
    if found is None:
        declared = plugins.backends(include_torch=False)
        known = plugins.backends()
        # Torch's debugging and testing-only backends work by name but are not advertised.
        torch_only = sorted(
            n for n in set(known) - set(declared) if "testing_only" not in n and "minifier" not in n
        )
        hint = did_you_mean(config.backend, known)
        add(
            "backend",
            f"{describe(config.backend)} is not a registered backend{hint}; registered by plugins: "
            f"{', '.join(sorted(set(declared) | {'no'}))}; known to torch: {', '.join(torch_only) or 'none'}"
            f"{plugins.missing_hint()}",
        )
        return
    spec = found.spec
    add("backend", plugins.unserved(found))
    if config.tiered.enabled and not spec.precompile:
        serialisable = (
            n for n, d in plugins.backends(include_torch=False).items() if d.spec.precompile
        )
        add(
            "tiered.enabled",
            f"tiered compilation saves the whole model's compiled function in a builder "
            f"process and loads it here; backend {config.backend!r} (plugin "
            f"{found.plugin!r}) does not declare its functions serialisable "
            "(BackendSpec.precompile); backends that do: " + ", ".join(sorted(serialisable)),
        )
    availability = spec.probe()
    if not availability.available:
        add("backend", f"backend {config.backend!r} is not available here: {availability.reason}")
    if config.mode is not None and spec.modes is not None and config.mode not in spec.modes:
        add(
            "mode",
            f"{describe(config.mode)} is not a mode backend {config.backend!r} accepts; allowed: "
            f"{', '.join(spec.modes) or 'none (leave mode unset)'}",
        )
    _check_options(add, f"backend {config.backend!r}", "options", config.options, spec.options)


def _deepspeed_imports(config: CompileConfig, sources: Mapping[str, str]) -> str | None:
    """DeepSpeed imports every module named in ``torch_autocast.lower_precision_safe_modules``."""
    deepspeed = config.distributed.deepspeed.config
    if not isinstance(deepspeed, Mapping):
        return None
    if not is_untrusted(sources.get("distributed.deepspeed.config", "")):
        return None
    section = deepspeed.get("torch_autocast")
    if not isinstance(section, Mapping) or section.get("lower_precision_safe_modules") is None:
        return None
    return (
        "torch_autocast.lower_precision_safe_modules makes DeepSpeed import the modules it names, "
        "so torchkiln does not take it from a file or the environment; pass the "
        "DeepSpeed configuration from Python instead (docs/configuration.md, "
        "'Options that can run code')"
    )


def _positive_size(value: float | None) -> str | None:
    if value is not None and not (math.isfinite(value) and 0 < value <= 2**40):
        return f"{describe(value)} is not a size in MiB; give a finite number above 0"
    return None


def _cache_dir(value: str | None, field: str = "cache_dir") -> str | None:
    if value is None:
        return None
    if "\x00" in value:
        return f"{describe(value)} contains a NUL character"
    if not value.strip():
        what, null = (
            ("inductor's cache", "torch's default")
            if field == "cache_dir"
            else ("what torchkiln compiles", "none")
        )
        return (
            f"an empty {field} would put {what} in the working directory; give a "
            f"directory path, or null for {null}"
        )
    if os.path.exists(value) and not os.path.isdir(value):  # neither raises
        return f"{describe(value)} exists and is not a directory; give a directory path"
    return None


def remote_cache_problem(url: str) -> str | None:
    """What is wrong with ``url`` as a ``remote_cache`` value, or ``None``."""
    scheme = urlsplit(url).scheme
    if scheme not in REMOTE_CACHE_SCHEMES:
        return f"{url!r} is not a Redis URL (allowed schemes: {', '.join(REMOTE_CACHE_SCHEMES)}; e.g. redis://127.0.0.1:6379)"
    try:
        import redis  # noqa: F401
    except ImportError:
        return "the Redis client is not installed (pip install 'torchkiln[redis]')"
    return None
