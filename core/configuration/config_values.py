"""Plain configuration values: the JSON-like shapes a file or the environment may hold
(:func:`plain_tree`, bounded in depth and size), and how a value is shown in a message
(:func:`describe`, a bounded ``repr``). docs/configuration.md ("A YAML file") lists the limits.
"""

from __future__ import annotations

import difflib
import json
import math
import re
import reprlib
import types
import typing
from collections.abc import Iterable
from typing import Any

from torchkiln.errors import ConfigError, ConfigProblem

MAX_DEPTH = 32
"""Deepest nesting of mappings and lists a file or variable may hold."""
MAX_VALUES = 10_000
"""Most values (mappings, lists, scalars, keys) one file or variable may hold, with every
YAML alias counted as a full copy of what it refers to."""
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")

_REPR = reprlib.Repr()
_REPR.maxlevel = 3
_REPR.maxdict = 6
_REPR.maxlist = 6
_REPR.maxtuple = 6
_REPR.maxset = 6
_REPR.maxstring = 80
_REPR.maxother = 80
_REPR.maxlong = 40


def describe(value: Any) -> str:
    """A ``repr`` of at most about a hundred characters, safe on shared and recursive data."""
    try:
        text = _REPR.repr(value)
    except Exception:  # a user object whose __repr__ raises
        text = f"<{type(value).__name__} object>"
    return text if len(text) <= 120 else text[:117] + "..."


def union_members(kind: Any) -> tuple[Any, ...]:
    """The members of a union type (``int | None``: ``(int, NoneType)``), else ``(kind,)``."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return typing.get_args(kind)
    return (kind,)


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'closest'?)`` for the choice closest to ``word``, or ``""``."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def join_path(path: str, key: Any) -> str:
    """``$.a`` + ``b`` -> ``$.a.b``; an int key is a list index (``$.a[2]``); a key with a dot
    or other punctuation is quoted (``$.options['cpp.cxx']``)."""
    if isinstance(key, int) and not isinstance(key, bool):
        return f"{path}[{key}]"
    text = str(key)
    if _PLAIN_KEY.fullmatch(text):
        return f"{path}.{text}"
    return f"{path}[{describe(text)}]"  # ``$.options['cpp.cxx']``: a dot inside one key


def config_error(source: str, message: str, path: str = "$") -> ConfigError:
    """A :class:`ConfigError` with one problem."""
    return ConfigError([ConfigProblem(path, message, source)])


class PlainValueError(ValueError):
    """A value that is not plain data, with the field path where it was found."""

    def __init__(self, path: str, message: str):
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


def plain_tree(value: Any) -> Any:
    """A fresh copy of ``value``, plain data as PyYAML's checked safe loader or ``json.loads``
    built it (dict, list, str, int, float, bool and None: each reader refuses any other kind
    with its own message).

    Shared sub-structures (YAML aliases) become independent copies, which is safe because the
    total is bounded by :data:`MAX_VALUES`. Raises :class:`PlainValueError` naming the path of
    the first value that is too deep, too large or out of range.
    """
    return _copy(value, "$", 0, [MAX_VALUES])


def _copy(value: Any, path: str, depth: int, budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise PlainValueError(
            path,
            f"more than {MAX_VALUES} values in all (YAML aliases count once per use); "
            "a torchkiln configuration is far smaller",
        )
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise PlainValueError(
                path, f"the whole number {describe(value)} does not fit in 64 bits"
            )
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PlainValueError(path, f"{value!r} is not allowed; give a finite number")
        return value
    if depth >= MAX_DEPTH:
        raise PlainValueError(path, f"nested deeper than {MAX_DEPTH} levels")
    # No cycle check: YAML alias cycles are refused before construction and JSON has none.
    if isinstance(value, dict):
        return {
            key: _copy(item, join_path(path, key), depth + 1, budget) for key, item in value.items()
        }
    return [
        _copy(item, join_path(path, index), depth + 1, budget) for index, item in enumerate(value)
    ]


# --- JSON text (environment variables) ---------------------------------------------------------

MAX_ENV_CHARS = 64 * 1024
"""Longest value of one ``TORCHKILN_*`` variable."""


def parse_json(text: str) -> Any:
    """Plain data from JSON text; ValueError says what is wrong (depth, duplicates, NaN, ...).

    The nesting depth is measured on the text first, so ``json.loads`` never recurses deeply.
    """
    depth = _json_depth(text)
    if depth > MAX_DEPTH:
        raise ValueError(f"JSON nested deeper than {MAX_DEPTH} levels")

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not allowed; give a finite number")

    def checked_int(digits: str) -> int:
        if len(digits) > 20:
            raise ValueError(f"a whole number of {len(digits)} digits does not fit in 64 bits")
        return int(digits)

    def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                raise ValueError(f"duplicate key {describe(key)}; give each key once")
            result[key] = value
        return result

    try:
        value = json.loads(
            text,
            parse_constant=no_constant,
            parse_int=checked_int,
            object_pairs_hook=unique_keys,
        )
    except json.JSONDecodeError as error:
        raise ValueError(f"not valid JSON ({error.msg} at character {error.pos})") from None
    return plain_tree(value)  # a PlainValueError is a ValueError reading "$.path: message"


def _json_depth(text: str) -> int:
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_DEPTH:
                break
        elif char in "]}":
            depth -= 1
    return deepest
