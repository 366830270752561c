"""Structure merged configuration into :class:`CompileConfig` and check it, collecting every
problem into one :class:`ConfigError`.

Structuring is cattrs with strict primitive hooks (``"yes"`` is not a boolean, ``1`` is not a
string), so a wrong type is reported with its path, not coerced. Semantic checks (registered
backend names, modes a backend takes, strategies a plugin declares) need the plugin manager.
"""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Mapping
from typing import Any

import attrs
import cattrs

from torchkiln.configuration.config import (
    DISPATCH_CHOICES,
    FLOAT_DTYPES,
    JOB_SHARE_CHOICES,
    PROGRESS_CHOICES,
    REGION_ERROR_POLICIES,
    REMOVED_DISPATCH,
    REST_POLICIES,
    TIERED_WHEN_CHOICES,
    CompileConfig,
)
from torchkiln.configuration.config_sources import dollar, humanise, section_classes
from torchkiln.configuration.config_values import describe
from torchkiln.configuration.option_safety import option_problems
from torchkiln.configuration.release_checks import release_problems
from torchkiln.configuration.value_checks import value_problems
from torchkiln.errors import ConfigError, ConfigProblem

_TYPE_NAMES = {
    bool: "a boolean (true/false)",
    int: "a whole number",
    float: "a number",
    str: "a string",
}


def _strict(kind: type) -> Any:
    def structure(value: Any, _: Any) -> Any:
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
            raise TypeError(
                f"expected {_TYPE_NAMES[kind]}, got {type(value).__name__} {describe(value)}"
            )
        return value

    return structure


def _string_tuple(value: Any, _: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"expected a list of strings, got {describe(value)}")
    return tuple(value)


def _mapping(value: Any, _: Any) -> dict[str, Any]:
    if value is None:  # as torch.compile(options=None), and an empty ``options:`` in YAML
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"expected a mapping, got {type(value).__name__} {describe(value)}")
    return dict(value)


def _mapping_or_path(value: Any, _: Any) -> dict[str, Any] | str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"expected a mapping or the path of a JSON file, got {type(value).__name__}")


def make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    for kind in (bool, int, float, str):
        converter.register_structure_hook(kind, _strict(kind))
    converter.register_structure_hook_func(lambda t: t == tuple[str, ...], _string_tuple)
    converter.register_structure_hook_func(lambda t: t == dict[str, Any], _mapping)
    converter.register_structure_hook_func(
        lambda t: t == (dict[str, Any] | str | None), _mapping_or_path
    )
    return converter


CONVERTER = make_converter()
_CATTRS_LINE = re.compile(r"^(?P<message>.*) @ (?P<path>\$.*)$")


def unknown_key_problems(
    values: Mapping[str, Any], sources: Mapping[str, str]
) -> list[ConfigProblem]:
    """Keys that are not fields, with the allowed ones and a close match."""
    problems = []
    for section, cls in section_classes():
        node: Any = values
        for part in [p for p in section.split(".") if p]:
            node = node.get(part) if isinstance(node, Mapping) else None
        if not isinstance(node, Mapping):
            continue
        allowed = [f.name for f in attrs.fields(cls)]
        for key in node:
            if key not in allowed:
                path = f"{section}.{key}" if section else str(key)
                close = difflib.get_close_matches(str(key), allowed, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                problems.append(
                    ConfigProblem(
                        dollar(path),
                        f"unknown field {describe(key)}{hint}; allowed: {', '.join(allowed)}",
                        sources.get(path, ""),
                    )
                )
    return problems


def without_unknown_keys(values: Mapping[str, Any]) -> dict[str, Any]:
    sections = dict(section_classes())

    def prune(node: Mapping[str, Any], section: str) -> dict[str, Any]:
        allowed = {f.name for f in attrs.fields(sections[section])}
        out = {}
        for key, value in node.items():
            if key not in allowed:
                continue
            child = f"{section}.{key}" if section else key
            out[key] = (
                prune(value, child) if child in sections and isinstance(value, Mapping) else value
            )
        return out

    return prune(values, "")


def structure(values: Mapping[str, Any], sources: Mapping[str, str]) -> CompileConfig:
    """Turn a merged mapping into a CompileConfig, or raise one ConfigError with every problem."""
    problems = unknown_key_problems(values, sources)
    try:
        config = CONVERTER.structure(without_unknown_keys(values), CompileConfig)
    except Exception as error:  # cattrs groups every failure in one exception
        for line in cattrs.transform_error(error):
            match = _CATTRS_LINE.match(line)
            message, path = (match["message"], match["path"]) if match else (line, "$")
            field = path.removeprefix("$.").removeprefix("$")
            problems.append(
                ConfigProblem(path, humanise(message, values, field), sources.get(field, ""))
            )
        raise ConfigError(problems) from None
    if problems:
        raise ConfigError(problems)
    return config


def validate(
    values: Mapping[str, Any],
    sources: Mapping[str, str],
    plugins: Any,
    problems: typing.Sequence[ConfigProblem] = (),
) -> CompileConfig:
    """:func:`structure` then :func:`check`, every problem (``problems`` first) in one
    ConfigError: fields that fail to structure are left at their defaults so that the
    semantic checks still run on the rest."""
    found = list(problems)
    config: CompileConfig | None
    try:
        config = structure(values, sources)
    except ConfigError as error:
        found.extend(error.problems)
        config = _structure_without(values, [p.path for p in error.problems])
    if config is not None:
        try:
            check(config, sources, plugins)
        except ConfigError as error:
            flagged = {p.path for p in found}
            found.extend(p for p in error.problems if p.path not in flagged)
    if found:
        raise ConfigError(found)
    assert config is not None
    return config


def _structure_without(
    values: Mapping[str, Any], bad_paths: typing.Iterable[str]
) -> CompileConfig | None:
    # Copies only the section mappings on each bad path: a deep copy of everything would
    # recurse through whatever a keyword argument holds (a list nested 10,000 deep, say).
    pruned = dict(values)
    for path in bad_paths:
        parts = path.split("[", 1)[0].removeprefix("$").removeprefix(".").split(".")
        node: dict[Any, Any] = pruned
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, Mapping):
                break
            node[part] = node = dict(child)  # the parent now holds the copy being pruned
        else:
            if parts[-1]:
                node.pop(parts[-1], None)
    try:
        return CONVERTER.structure(without_unknown_keys(pruned), CompileConfig)
    except Exception:
        return None


def _dispatch_problem(value: Any) -> str | None:
    if value in REMOVED_DISPATCH:
        return (
            f"dispatch {value!r} was removed (it saved under 2% of a step and "
            "read Dynamo's private cache entries); use 'dynamo', the only dispatch"
        )
    return _choice(value, DISPATCH_CHOICES, "a dispatch setting")


def _choice(
    config_value: Any, allowed: typing.Iterable[str], what: str, missing_hint: str = ""
) -> str | None:
    allowed = sorted(allowed)
    if config_value in allowed:
        return None
    close = difflib.get_close_matches(str(config_value), allowed, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return (
        f"{describe(config_value)} is not {what}{hint}; allowed: {', '.join(allowed)}{missing_hint}"
    )


def _unknown_option(owner: str, key: str, accepted: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(key, list(accepted), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{owner} does not accept option {describe(key)}{hint}; allowed: {', '.join(accepted) or 'none'}"


def _unserved(plugins: Any, declared: Any) -> str | None:
    """A declared name whose plugin lacks the hook that serves it is refused here, like an
    unknown name (it would fail only when compiling, or run eagerly under
    ``on_region_error="eager"``)."""
    if declared is None or not hasattr(plugins, "unserved"):
        return None
    return plugins.unserved(declared)


def _selector_option_problems(
    config: CompileConfig, sources: Mapping[str, str], plugins: Any
) -> list[ConfigProblem]:
    declared = plugins.selectors().get(config.regions.strategy)
    if declared is None or declared.spec.options is None:
        return []
    accepted = declared.spec.options
    return [
        ConfigProblem(
            f"$.regions.options.{key}",
            _unknown_option(f"selector {config.regions.strategy!r}", key, accepted),
            sources.get("regions.options", ""),
        )
        for key in config.regions.options
        if key not in accepted
    ]


TIERED_STRATEGIES = ("none", "ddp")
"""Distributed strategies tiered compilation runs under: the whole-model form replaces the
forward that DDP calls; FSDP2 and DeepSpeed shard parameters per block, which one whole-model
graph built from an unsharded copy would not reproduce."""


def _tiered_problems(config: CompileConfig, sources: Mapping[str, str]) -> list[ConfigProblem]:
    tiered = config.tiered
    problems = [
        ConfigProblem(f"$.tiered.{name}", f"{value} is not between {low} and {high}",
                      sources.get(f"tiered.{name}", ""))
        for name, value, low, high in (("threads", tiered.threads, 1, 256),
                                       ("nice", tiered.nice, 0, 19))
        if not low <= value <= high
    ]  # fmt: skip
    bound = tiered.max_slowdown
    if bound != 0 and not 1 < bound <= 100:
        problems.append(
            ConfigProblem(
                "$.tiered.max_slowdown",
                f"{bound} is neither 0 (no bound) nor a ratio above 1 and at most 100 (1.25: "
                "the builder may make the mean step at most 25% slower)",
                sources.get("tiered.max_slowdown", ""),
            )
        )
    strategy = config.distributed.strategy
    if tiered.enabled and strategy not in TIERED_STRATEGIES:
        problems.append(
            ConfigProblem(
                "$.tiered.enabled",
                f"tiered compilation is not supported with distributed strategy {strategy!r} "
                f"(allowed: {', '.join(TIERED_STRATEGIES)}): it shards parameters per block, "
                "and a whole-model graph built from an unsharded copy would not gather them",
                sources.get("tiered.enabled", ""),
            )
        )
    return problems


def check(config: CompileConfig, sources: Mapping[str, str], plugins: Any) -> None:
    """Semantic checks against the registered plugins; raises one ConfigError."""
    problems: list[ConfigProblem] = []

    def add(path: str, message: str | None) -> None:
        if message:
            problems.append(ConfigProblem(dollar(path), message, sources.get(path, "")))

    add(
        "on_region_error",
        _choice(config.on_region_error, REGION_ERROR_POLICIES, "a region error policy"),
    )
    add("regions.rest", _choice(config.regions.rest, REST_POLICIES, "a rest policy"))
    add("progress", _choice(config.progress, PROGRESS_CHOICES, "a progress setting"))
    add("dispatch", _dispatch_problem(config.dispatch))
    if config.remote_cache is not None:
        from torchkiln.configuration.value_checks import remote_cache_problem

        add("remote_cache", remote_cache_problem(config.remote_cache))
    add("tiered.when", _choice(config.tiered.when, TIERED_WHEN_CHOICES, "a tiered.when setting"))
    add("job.share", _choice(config.job.share, JOB_SHARE_CHOICES, "a job.share setting"))
    if not 0 < config.job.timeout <= 7 * 24 * 3600:
        add("job.timeout", f"{config.job.timeout} is not between 0 (exclusive) and 604800 seconds")
    precision = config.distributed.fsdp2.mixed_precision
    for name in ("param_dtype", "reduce_dtype", "output_dtype"):
        value = getattr(precision, name)
        if value is not None:
            add(
                f"distributed.fsdp2.mixed_precision.{name}",
                _choice(value, FLOAT_DTYPES, "a floating-point dtype name"),
            )
    if config.regions.min_repeats < 1:
        add("regions.min_repeats", f"{config.regions.min_repeats} must be at least 1")
    if config.distributed.fsdp2.replicate_degree < 1:
        add(
            "distributed.fsdp2.replicate_degree",
            f"{config.distributed.fsdp2.replicate_degree} must be at least 1",
        )
    problems.extend(_tiered_problems(config, sources))
    problems.extend(release_problems(config, sources))
    missing_hint = plugins.missing_hint()
    add(
        "regions.strategy",
        _choice(config.regions.strategy, plugins.selectors(), "a declared selector", missing_hint),
    )
    add(
        "distributed.strategy",
        _choice(
            config.distributed.strategy,
            plugins.distributed_strategies(),
            "a declared distributed strategy",
            missing_hint,
        ),
    )
    for path, declared in (
        ("regions.strategy", plugins.selectors().get(config.regions.strategy)),
        ("distributed.strategy", plugins.distributed_strategies().get(config.distributed.strategy)),
    ):
        add(path, _unserved(plugins, declared))
    problems.extend(_selector_option_problems(config, sources, plugins))
    if config.regions.strategy == "classes" and not config.regions.classes:
        add(
            "regions.classes",
            "strategy 'classes' needs at least one class-name glob in regions.classes",
        )
    if config.regions.strategy == "paths" and not config.regions.paths:
        add(
            "regions.paths", "strategy 'paths' needs at least one module-path glob in regions.paths"
        )
    if config.mode is not None and config.options:
        add(
            "mode",
            f"mode {describe(config.mode)} and options {describe(list(config.options))} cannot both be set "
            "(torch.compile takes one or the other); put the mode's settings into options instead",
        )
    problems.extend(value_problems(config, sources))
    if config.backend != "no":
        problems.extend(_backend_problems(config, sources, plugins))
    problems.extend(option_problems(config, sources))
    strategy = plugins.distributed_strategies().get(config.distributed.strategy)
    if strategy is not None:
        availability = strategy.spec.probe()
        if not availability.available:
            add(
                "distributed.strategy",
                f"{describe(config.distributed.strategy)} is not available: {availability.reason}",
            )
    if problems:
        raise ConfigError(problems)


def _backend_problems(
    config: CompileConfig, sources: Mapping[str, str], plugins: Any
) -> list[ConfigProblem]:
    source = sources.get("backend", "")
    found = plugins.backend(config.backend)
    if found is None:
        declared = plugins.backends(include_torch=False)
        known = plugins.backends()
        # Torch's debugging and testing-only backends work by name but are not advertised.
        torch_only = sorted(
            n for n in set(known) - set(declared) if "testing_only" not in n and "minifier" not in n
        )
        close = difflib.get_close_matches(config.backend, list(known), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return [
            ConfigProblem(
                "$.backend",
                (
                    f"{describe(config.backend)} is not a registered backend{hint}; registered by plugins: "
                    f"{', '.join(sorted(set(declared) | {'no'}))}; known to torch: {', '.join(torch_only) or 'none'}"
                    f"{plugins.missing_hint()}"
                ),
                source,
            )
        ]
    spec = found.spec
    problems = []
    unserved = _unserved(plugins, found)
    if unserved:
        problems.append(ConfigProblem("$.backend", unserved, source))
    if config.tiered.enabled and not spec.precompile:
        problems.append(
            ConfigProblem(
                "$.tiered.enabled",
                f"tiered compilation saves the whole model's compiled function in a builder "
                f"process and loads it here; backend {config.backend!r} (plugin "
                f"{found.plugin!r}) does not declare its functions serialisable "
                "(BackendSpec.precompile); backends that do: "
                + ", ".join(
                    sorted(
                        n
                        for n, d in plugins.backends(include_torch=False).items()
                        if d.spec.precompile
                    )
                ),
                sources.get("tiered.enabled", ""),
            )
        )
    availability = spec.probe()
    if not availability.available:
        problems.append(
            ConfigProblem(
                "$.backend",
                f"backend {config.backend!r} is not available here: {availability.reason}",
                source,
            )
        )
    if config.mode is not None and spec.modes is not None and config.mode not in spec.modes:
        problems.append(
            ConfigProblem(
                "$.mode",
                (
                    f"{describe(config.mode)} is not a mode backend {config.backend!r} accepts; allowed: "
                    f"{', '.join(spec.modes) or 'none (leave mode unset)'}"
                ),
                sources.get("mode", ""),
            )
        )
    if spec.options is not None:
        for key in config.options:
            if key not in spec.options:
                problems.append(
                    ConfigProblem(
                        f"$.options.{key}",
                        _unknown_option(f"backend {config.backend!r}", key, spec.options),
                        sources.get("options", ""),
                    )
                )
    return problems
