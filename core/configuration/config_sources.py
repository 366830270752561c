"""Where configuration comes from, lowest to highest precedence:

defaults < YAML file < ``TORCHKILN_*`` environment < keyword arguments < ``resolve_compile_config``

The YAML file is the explicit path given, else ``$TORCHKILN_CONFIG``, else ``./torchkiln.yaml``
when it exists. Each layer is a nested mapping; layers merge field by field and every field
remembers its source, which ``torchkiln config show`` prints and error messages name.
"""

from __future__ import annotations

import difflib
import logging
import os
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs

from torchkiln.configuration.config import REMOVED_FIELDS, CompileConfig
from torchkiln.configuration.config_values import (
    MAX_ENV_CHARS,
    config_error,
    describe,
    parse_json,
    union_members,
)
from torchkiln.configuration.yaml_reader import read_yaml_file
from torchkiln.errors import ConfigProblem

logger = logging.getLogger("torchkiln.config")

ENV_PREFIX = "TORCHKILN_"
DEFAULT_FILE = "torchkiln.yaml"
# Shorthands: a string in place of a section means its strategy.
SECTION_SHORTHANDS = {"regions": "strategy", "distributed": "strategy"}
# A boolean in place of a section means its ``enabled`` field (``tiered: true``).
SECTION_SWITCHES = {"tiered": "enabled"}
# TORCHKILN_* variables that are not configuration fields.
CONTROL_VARIABLES = frozenset(
    {
        "TORCHKILN_CONFIG",
        "TORCHKILN_DISABLE_PLUGIN_AUTOLOAD",
        "TORCHKILN_PLUGINS",
        "TORCHKILN_DISABLED_PLUGINS",
        "TORCHKILN_STRICT_PLUGINS",
        "TORCHKILN_TRACE_PLUGINS",
        "TORCHKILN_ACCELERATE_CONFIG",
        "TORCHKILN_ON_DOUBLE_COMPILE",  # read by torchkiln.engine.double_compile
    }
)
ENV_TRUE = ("1", "true", "yes", "on")
ENV_FALSE = ("0", "false", "no", "off")


@attrs.frozen
class Layer:
    """One source of configuration values."""

    source: str
    """``file:PATH``, ``env``, ``argument``, ``plugin:NAME`` ..."""
    values: Mapping[str, Any]
    """Nested mapping in the YAML shape."""
    env_names: Mapping[str, str] = attrs.Factory(dict)
    """For the environment layer: field path -> variable name."""

    def source_of(self, path: str) -> str:
        if path in self.env_names:
            return f"env:{self.env_names[path]}"
        return self.source


# --- the schema, derived from the attrs classes ------------------------------------------------


def leaf_fields(cls: type = CompileConfig, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every settable field as (dotted path, type); attrs-class fields are descended into."""
    hints = typing.get_type_hints(cls)
    for field in attrs.fields(cls):
        path = f"{prefix}{field.name}"
        kind = hints[field.name]
        if attrs.has(kind):
            yield from leaf_fields(kind, path + ".")
        else:
            yield path, kind


def section_classes(cls: type = CompileConfig, prefix: str = "") -> Iterator[tuple[str, type]]:
    """Every attrs section as (dotted path, class); the root is ``""``."""
    yield prefix.rstrip("."), cls
    hints = typing.get_type_hints(cls)
    for field in attrs.fields(cls):
        if attrs.has(hints[field.name]):
            yield from section_classes(hints[field.name], f"{prefix}{field.name}.")


def env_name(path: str) -> str:
    return ENV_PREFIX + path.upper().replace(".", "_")


def dollar(path: str) -> str:
    return "$." + path if path else "$"


# --- the file layer ----------------------------------------------------------------------------


def find_config_file(
    explicit: str | os.PathLike[str] | None, env: Mapping[str, str], cwd: Path
) -> Path | None:
    """The YAML file to read: the one given, else ``$TORCHKILN_CONFIG``, else
    ``./torchkiln.yaml`` when it exists. Each choice is logged at INFO on ``torchkiln.config``
    with its absolute path, so a file nobody named is visible in the logs."""
    if explicit is not None:
        return _chosen(Path(explicit), "given")
    if env.get("TORCHKILN_CONFIG"):
        return _chosen(Path(env["TORCHKILN_CONFIG"]), "named by TORCHKILN_CONFIG")
    candidate = cwd / DEFAULT_FILE
    try:
        found = candidate.is_file()
    except OSError:
        found = False
    if not found:
        return None
    return _chosen(candidate, "found in the working directory (not named by anyone)")


def _chosen(path: Path, how: str) -> Path:
    logger.info("reading torchkiln configuration file %s (%s)", os.path.abspath(path), how)
    return path


def _near_a_field(key: str, fields: set[str]) -> bool:
    """A field, or close to one (``bakend``: a typo in a torchkiln file, shown with a hint)."""
    return key in fields or bool(difflib.get_close_matches(key, fields, n=1))


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a torchkiln YAML file with a safe, size- and depth-limited loader; any problem is a
    ConfigError (:mod:`torchkiln.configuration.yaml_reader`). A mapping without one torchkiln field is not a
    torchkiln configuration (``/etc/shadow`` reads as one): refused without showing its keys."""
    data = read_yaml_file(path)
    fields = {field.name for field in attrs.fields(CompileConfig)} | set(REMOVED_FIELDS)
    if data and not any(_near_a_field(str(key), fields) for key in data):
        raise config_error(
            f"file:{path}",
            f"not a torchkiln configuration: none of its {len(data)} top-level keys is a "
            f"torchkiln field (its contents are not shown); fields: {', '.join(sorted(fields))}",
        )
    return data


# --- the environment layer ---------------------------------------------------------------------


def _parse_env_value(raw: str, kind: Any) -> Any:
    """Turn one environment string into a value of ``kind``; ValueError says what is allowed."""
    if len(raw) > MAX_ENV_CHARS:
        raise ValueError(
            f"the value is {len(raw)} characters long; at most {MAX_ENV_CHARS} are read"
        )
    text = raw.strip()
    optional = type(None) in union_members(kind)
    members = [member for member in union_members(kind) if member is not type(None)]
    if optional and text.lower() in ("", "none", "null", "auto"):
        return None
    if str in members[1:] and not text.startswith("{"):
        return text  # ``dict | str``: a JSON object, else a string (a file path)
    base = members[0]
    if base is bool:
        if text.lower() in ENV_TRUE:
            return True
        if text.lower() in ENV_FALSE:
            return False
        allowed = "/".join(ENV_TRUE + ENV_FALSE) + ("/none" if optional else "")
        raise ValueError(f"{describe(raw)} is not a boolean; allowed: {allowed}")
    if base is int:
        try:
            if len(text) > 20:
                raise ValueError
            return int(text)
        except ValueError:
            raise ValueError(f"{describe(raw)} is not a whole number of 64 bits") from None
    if base is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{describe(raw)} is not a number") from None
    if typing.get_origin(base) is tuple:
        return tuple(part.strip() for part in text.split(",") if part.strip())
    if typing.get_origin(base) is dict or base is dict:
        try:
            value = parse_json(text)
        except ValueError as error:
            raise ValueError(f"{describe(raw)} is not a JSON object: {error}") from None
        if not isinstance(value, dict):
            raise ValueError(f"{describe(raw)} is not a JSON object")
        return value
    return text


def env_fields() -> dict[str, tuple[str, Any]]:
    """Variable name -> (field path, type), shorthands included."""
    table = {env_name(path): (path, kind) for path, kind in leaf_fields()}
    for section, field in SECTION_SHORTHANDS.items():
        table[env_name(section)] = (f"{section}.{field}", str)
    for section, field in SECTION_SWITCHES.items():
        table[env_name(section)] = (f"{section}.{field}", bool)
    return table


def read_env(env: Mapping[str, str]) -> tuple[Layer, list[ConfigProblem], list[str]]:
    """The environment layer, the problems found, and unknown TORCHKILN_* names."""
    table = env_fields()
    values: dict[str, Any] = {}
    names: dict[str, str] = {}
    problems: list[ConfigProblem] = []
    unknown: list[str] = []
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name in CONTROL_VARIABLES:
            continue
        if name not in table:
            unknown.append(name)
            continue
        path, kind = table[name]
        try:
            value = _parse_env_value(env[name], kind)
        except ValueError as error:
            problems.append(ConfigProblem(dollar(path), str(error), f"env:{name}"))
            continue
        set_path(values, path, value)
        names[path] = name
    return Layer("env", values, names), problems, unknown


# --- merging -----------------------------------------------------------------------------------


def set_path(target: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for part in parents:
        target = target.setdefault(part, {})
    target[last] = value


def normalise_shorthands(values: Mapping[str, Any]) -> dict[str, Any]:
    """``regions: whole`` means ``regions: {strategy: whole}``; attrs instances become dicts."""
    result: dict[str, Any] = {}
    for key, value in values.items():
        if attrs.has(type(value)):
            value = attrs.asdict(value, recurse=True)
        if key in SECTION_SHORTHANDS and isinstance(value, str):
            value = {SECTION_SHORTHANDS[key]: value}
        if key in SECTION_SWITCHES and isinstance(value, bool):
            value = {SECTION_SWITCHES[key]: value}
        result[key] = value
    return result


def merge_layers(layers: list[Layer]) -> tuple[dict[str, Any], dict[str, str]]:
    """Merge layers (later wins) into one nested mapping plus each leaf's source.

    Sections (attrs sub-configs) merge key by key; any other value, mappings such as
    ``options`` included, is replaced whole.
    """
    sections = {path for path, _ in section_classes()}
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}

    def walk(target: dict[str, Any], values: Mapping[str, Any], prefix: str, layer: Layer) -> None:
        for key, value in values.items():
            path = f"{prefix}{key}"
            if path in sections and isinstance(value, Mapping):
                child = target.get(key)
                if not isinstance(child, dict):
                    child = target[key] = {}
                walk(child, value, path + ".", layer)
            else:
                target[key] = value
                sources[path] = layer.source_of(path)

    for layer in layers:
        walk(merged, normalise_shorthands(layer.values), "", layer)
    return merged, sources


def all_sources(explicit: Mapping[str, str]) -> dict[str, str]:
    """Every leaf field path with its source, ``default`` where nothing set it."""
    return {path: explicit.get(path, "default") for path, _ in leaf_fields()}
