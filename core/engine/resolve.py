"""Resolve the effective :class:`CompileConfig` from every source, and say where each value
came from."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeAlias

import attrs

from torchkiln.configuration import config_sources as sources_
from torchkiln.configuration.config import CompileConfig
from torchkiln.configuration.config_validation import validate
from torchkiln.configuration.option_safety import unnamed_file_problems
from torchkiln.configuration.store_layout import expand_store
from torchkiln.errors import ConfigError, ConfigProblem
from torchkiln.plugin_host.default_manager import PluginsArg, as_plugin_manager
from torchkiln.plugin_host.hook_calls import call_implementation, plain_implementations
from torchkiln.plugin_host.plugin_faults import bad_result, raised_in
from torchkiln.plugin_host.plugin_manager import PluginManager

ConfigArg: TypeAlias = CompileConfig | Mapping[str, Any] | str | os.PathLike[str] | None


@attrs.frozen
class ResolvedConfig:
    """The effective configuration and the source of every field."""

    config: CompileConfig
    sources: Mapping[str, str]
    """Dotted field path -> ``default``, ``file:PATH``, ``env:NAME``, ``argument``,
    ``plugin:NAME``."""
    file: Path | None = None


def resolve_config(
    config: ConfigArg = None,
    *,
    plugins: PluginsArg = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    **options: Any,
) -> ResolvedConfig:
    """Merge defaults < YAML file < ``TORCHKILN_*`` < ``options``, validate, run plugins.

    :param config: a YAML path (used instead of ``$TORCHKILN_CONFIG`` / ``./torchkiln.yaml``), a
        mapping in the YAML shape (a layer above the file), or a complete ``CompileConfig``
        (used as given: no file or environment is read).
    :param plugins: the plugin manager (default: the process one).
    :param env: the environment (default ``os.environ``).
    :param cwd: where ``torchkiln.yaml`` is looked for (default: the current directory).
    :param options: ``CompileConfig`` fields, highest precedence.
    :raises ConfigError: listing every bad value with its path, source and allowed values.
    """
    pm = as_plugin_manager(plugins).ensure_loaded()
    env = dict(os.environ if env is None else env)
    layers, problems, file = _layers(config, env, Path(cwd or os.getcwd()))
    if options:
        layers.append(sources_.Layer("argument", options))
    values, explicit = sources_.merge_layers(layers)
    all_sources = sources_.all_sources(explicit)
    if (
        file is not None
        and not isinstance(config, str | os.PathLike)
        and not env.get("TORCHKILN_CONFIG")
    ):
        # ./torchkiln.yaml found in the working directory: nobody chose it.
        problems = [*problems, *unnamed_file_problems(values, explicit, f"file:{file}")]
    # explicit also holds the sources of unknown keys, which error messages name.
    resolved = validate(values, {**explicit, **all_sources}, pm, problems)
    resolved, all_sources = _apply_plugins(resolved, all_sources, layers, pm)
    resolved, all_sources = expand_store(resolved, all_sources)
    return ResolvedConfig(resolved, all_sources, file)


def _layers(
    config: ConfigArg, env: Mapping[str, str], cwd: Path
) -> tuple[list[sources_.Layer], list[ConfigProblem], Path | None]:
    if isinstance(config, CompileConfig):
        return [sources_.Layer("config object", attrs.asdict(config))], [], None
    layers: list[sources_.Layer] = []
    path_arg = config if isinstance(config, str | os.PathLike) else None
    file = sources_.find_config_file(path_arg, env, cwd)
    if file is not None:
        layers.append(sources_.Layer(f"file:{file}", sources_.read_yaml(file)))
    env_layer, problems, unknown = sources_.read_env(env)
    if unknown:
        known = sorted(sources_.env_fields()) + sorted(sources_.CONTROL_VARIABLES)
        warnings.warn(
            f"ignoring unknown environment variable(s) {', '.join(unknown)}; torchkiln reads: "
            + ", ".join(known),
            RuntimeWarning,
            stacklevel=4,
        )
    layers.append(env_layer)
    if isinstance(config, Mapping):
        layers.append(sources_.Layer("argument", config))
    elif config is not None and path_arg is None:
        problem = (
            "config must be a CompileConfig, a mapping or the path of a YAML file, "
            f"not {type(config).__name__}"
        )
        raise ConfigError([ConfigProblem("$", problem, "argument")])
    return layers, problems, file


def _apply_plugins(
    config: CompileConfig, sources: dict[str, str], layers: list[sources_.Layer], pm: PluginManager
) -> tuple[CompileConfig, dict[str, str]]:
    """Let every ``resolve_compile_config`` implementation adjust; the first called wins."""
    plugin_layers: list[sources_.Layer] = []
    owners: dict[str, str] = {}
    for impl in plain_implementations(pm, "resolve_compile_config"):
        try:  # one plugin's override at a time, each inside every wrapper of the hook
            override = call_implementation(
                pm, "resolve_compile_config", impl, config=config, sources=sources
            )
        except ConfigError:
            raise
        except Exception as error:
            raise raised_in(pm, "resolve_compile_config", error, impl.plugin_name) from error
        if override is not None and not isinstance(override, Mapping):
            raise bad_result(
                "resolve_compile_config", impl.plugin_name, override, "a mapping or None"
            )
        if not override:
            continue
        layer = sources_.Layer(f"plugin:{impl.plugin_name}", override)
        _, paths = sources_.merge_layers([layer])
        for path in paths:
            if path in owners:
                warnings.warn(
                    f"plugins {owners[path]!r} and {impl.plugin_name!r} both set {path!r} in "
                    f"resolve_compile_config; keeping the value of {owners[path]!r}",
                    RuntimeWarning,
                    stacklevel=4,
                )
        owners.update({p: impl.plugin_name for p in paths if p not in owners})
        plugin_layers.append(layer)
    if not plugin_layers:
        return config, sources
    # Reversed, so the first-called plugin is merged last and wins.
    values, explicit = sources_.merge_layers(layers + plugin_layers[::-1])
    merged_sources = sources_.all_sources(explicit)
    adjusted = validate(values, {**explicit, **merged_sources}, pm)
    return adjusted, merged_sources
