"""Structure merged configuration into :class:`CompileConfig` and check it, collecting every
problem into one :class:`ConfigError`.

Structuring is cattrs with strict primitive hooks (``"yes"`` is not a boolean, ``1`` is not a
string), so a wrong type is reported with its path, not coerced. The semantic checks
(:mod:`torchkiln.configuration.value_checks`) need the plugin manager.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Mapping
from typing import Any

import attrs
import cattrs

from torchkiln.configuration.config import REMOVED_FIELDS, CompileConfig
from torchkiln.configuration.config_sources import SECTION_SHORTHANDS, dollar, section_classes
from torchkiln.configuration.config_values import describe, did_you_mean
from torchkiln.configuration.value_checks import check
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


def known_fields(
    values: Mapping[str, Any], sources: Mapping[str, str]
) -> tuple[dict[str, Any], list[ConfigProblem]]:
    """``values`` without the keys that are not fields, and a problem for each such key, with
    the allowed ones and a close match (section by section, the root first)."""
    sections = dict(section_classes())
    order = {section: index for index, section in enumerate(sections)}
    found: list[tuple[int, ConfigProblem]] = []

    def prune(node: Mapping[str, Any], section: str) -> dict[str, Any]:
        allowed = [f.name for f in attrs.fields(sections[section])]
        out = {}
        for key, value in node.items():
            path = f"{section}.{key}" if section else str(key)
            if not section and key in REMOVED_FIELDS:
                problem = ConfigProblem(dollar(path), REMOVED_FIELDS[key], sources.get(path, ""))
                found.append((order[section], problem))
            elif key not in allowed:
                hint = did_you_mean(str(key), allowed)
                message = f"unknown field {describe(key)}{hint}; allowed: {', '.join(allowed)}"
                problem = ConfigProblem(dollar(path), message, sources.get(path, ""))
                found.append((order[section], problem))
            elif path in sections and isinstance(value, Mapping):
                out[key] = prune(value, path)
            else:
                out[key] = value
        return out

    pruned = prune(values, "")
    return pruned, [problem for _, problem in sorted(found, key=lambda item: item[0])]


def validate(
    values: Mapping[str, Any],
    sources: Mapping[str, str],
    plugins: Any,
    problems: typing.Sequence[ConfigProblem] = (),
) -> CompileConfig:
    """Structure ``values`` into a CompileConfig, then :func:`check` it; every problem
    (``problems`` first) in one ConfigError: fields that fail to structure are left at their
    defaults so that the semantic checks still run on the rest."""
    known, unknown = known_fields(values, sources)
    found = [*problems, *unknown]
    config: CompileConfig | None
    try:
        config = CONVERTER.structure(known, CompileConfig)
    except Exception as error:  # cattrs groups every failure in one exception
        bad_paths = []
        for line in cattrs.transform_error(error):
            match = _CATTRS_LINE.match(line)
            message, path = (match["message"], match["path"]) if match else (line, "$")
            field = path.removeprefix("$.").removeprefix("$")
            found.append(
                ConfigProblem(path, humanise(message, values, field), sources.get(field, ""))
            )
            bad_paths.append(path)
        config = _structure_without(values, bad_paths)
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
        return CONVERTER.structure(known_fields(pruned, {})[0], CompileConfig)
    except Exception:
        return None


def humanise(message: str, values: Mapping[str, Any], field: str) -> str:
    """cattrs says 'invalid value for type, expected X'; add the bad value."""
    node: Any = values
    for part in field.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    sections = dict(section_classes())
    if field and field in sections:
        # cattrs says 'expected RegionsConfig' or "unknown error ('list' object has no
        # attribute 'keys')" for a section that is not a mapping.
        fields = ", ".join(f.name for f in attrs.fields(sections[field]))
        shorthand = " or a strategy name" if field in SECTION_SHORTHANDS else ""
        return f"expected a mapping with the fields {fields}{shorthand} (got {describe(node)})"
    if message.startswith("invalid value for type"):
        expected = message.removeprefix("invalid value for type, ")
        expected = expected.replace("dict[str, typing.Any]", "a mapping").replace(
            " | str", " or a path"
        )
        expected = expected.replace("expected tuple", "expected a list of strings")
        if isinstance(node, bool) and "str" in expected:
            # YAML 1.1 reads unquoted on/off/yes/no as booleans: `progress: off` is False.
            return (
                f"{expected} (got {describe(node)}; YAML reads unquoted on/off/yes/no as booleans, "
                f"quote the value: '{'on' if node else 'off'}')"
            )
        return f"{expected} (got {describe(node)})"
    return message
