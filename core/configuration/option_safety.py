"""``options`` checked before anything is compiled: real names, right types, and nothing from a
file or the environment that could run code (a free string, a list, a mapping or a callable can
name a program, path, module or function, such as ``cpp.cxx``). Python and plugins may set any
option. docs/configuration.md, "Options that can run code", states the rule and why.
"""

from __future__ import annotations

import difflib
import functools
import math
import re
import typing
from collections.abc import Mapping
from typing import Any

from torchkiln._internals import dynamo, inductor
from torchkiln.configuration.config import CompileConfig
from torchkiln.configuration.config_values import describe, join_path, union_members
from torchkiln.errors import ConfigProblem

UNTRUSTED_SOURCES = ("file:", "env:")
"""Sources whose ``options`` are filtered: a YAML file (named or found) and ``TORCHKILN_*``."""

_DENIED_FROM_FILES = re.compile(r"remote|upload|hook|TESTING|^test_configs\.|^_", re.IGNORECASE)
"""Switches refused from files whatever their type: remote caches load compiled binaries from a
server (or send them to one), hooks run registered code, the rest are torch's own test knobs."""
_SCALARS = (bool, int, float)
_DOCS = "docs/configuration.md, 'Options that can run code'"


@functools.cache
def inductor_settings() -> dict[str, Any]:
    """Every ``torch._inductor.config`` setting name -> its declared type."""
    config = inductor.config()
    current = config.get_config_copy()
    get_type = getattr(config, "get_type", None)  # declared types; older torch: the default's
    if get_type is None:
        return {name: type(value) for name, value in current.items()}
    return {name: get_type(name) for name in current}


@functools.cache
def dynamo_settings() -> frozenset[str]:
    return frozenset(dynamo.config().get_config_copy())


def is_untrusted(source: str) -> bool:
    return source.startswith(UNTRUSTED_SOURCES)


def option_problems(config: CompileConfig, sources: Mapping[str, str]) -> list[ConfigProblem]:
    """Every problem with ``config.options``: names, types, finiteness, and safety by source."""
    source = sources.get("options", "")
    problems: list[ConfigProblem] = []

    def add(key: Any, message: str) -> None:
        path = join_path("$.options", key) if isinstance(key, str) else "$.options"
        problems.append(ConfigProblem(path, message, source))

    for key, value in config.options.items():
        if not isinstance(key, str):
            add(key, f"option names are strings, got {describe(key)}")
            continue
        if isinstance(value, float) and not math.isfinite(value):
            add(key, f"{value!r} is not allowed; give a finite number")
            continue
        if key in TORCH_COMPILE_OPTIONS:
            message = _torch_compile_option_problem(key, value, is_untrusted(source))
        elif config.backend == "inductor":
            message = _inductor_problem(key, value, is_untrusted(source))
        elif is_untrusted(source):
            message = _other_backend_problem(config.backend, key, value)
        else:
            message = None
        if message:
            add(key, message)
    return problems


TORCH_COMPILE_OPTIONS = frozenset({"guard_filter_fn"})
"""Keys of ``options`` that ``torch.compile`` itself takes out before the backend sees them
(whatever the backend)."""


def _torch_compile_option_problem(key: str, value: Any, untrusted: bool) -> str | None:
    if untrusted:
        return (
            f"{key!r} is a function torch.compile calls, so torchkiln does not take it from a "
            f"file or the environment; pass it from Python (options={{{key!r}: ...}}), see {_DOCS}"
        )
    if not callable(value):
        return f"{key!r} takes a function, got {_kind(value)} {describe(value)}"
    return None


def _inductor_problem(key: str, value: Any, untrusted: bool) -> str | None:
    settings = inductor_settings()
    name = key.replace("-", "_")
    if name not in settings:
        return _unknown(key, name, settings)
    declared = settings[name]
    if not _matches(value, declared):
        return (
            f"inductor option {key!r} takes {_type_text(declared)}, got {_kind(value)} "
            f"{describe(value)}"
        )
    if untrusted and not _safe_from_files(name, declared):
        return (
            f"inductor option {key!r} ({_type_text(declared)}) can name a program, path, "
            "module or function, or make inductor fetch or run code, so torchkiln does not "
            "take it from a file or the environment; set it from Python instead "
            f"(torchkiln.compile(model, options={{...}})), see {_DOCS}"
        )
    return None


def _unknown(key: str, name: str, settings: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(name, list(settings), n=3, cutoff=0.75)
    hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
    note = ""
    if name in dynamo_settings():
        note = (
            f"; {name!r} is a torch._dynamo.config setting, and options reach only inductor "
            "(set it with torch._dynamo.config.patch around the first call)"
        )
    return (
        f"{describe(key)} is not an inductor option{hint}{note} (python -c 'import "
        "torch._inductor.config as c; print(*c.get_config_copy())' lists every setting)"
    )


def _other_backend_problem(backend: str, key: str, value: Any) -> str | None:
    if value is None or isinstance(value, _SCALARS):
        return None
    return (
        f"option {key!r} of backend {backend!r} is {_kind(value)}; from a file or the "
        "environment, options of backends other than inductor may only be booleans, numbers "
        "or null, because torchkiln cannot tell whether a string names a program or a path. "
        f"Set it from Python instead, see {_DOCS}"
    )


def _safe_from_files(name: str, declared: Any) -> bool:
    if _DENIED_FROM_FILES.search(name):
        return False
    return all(_closed_kind(member) for member in union_members(declared))


def _closed_kind(kind: Any) -> bool:
    """A switch, a number, ``None``, or a Literal of constants: it cannot name anything."""
    if kind is type(None) or kind in _SCALARS:
        return True
    if _is_literal(kind):
        return all(isinstance(arg, (*_SCALARS, str, type(None))) for arg in typing.get_args(kind))
    return False


def _matches(value: Any, declared: Any) -> bool:
    """``value`` fits ``declared``; kinds this module cannot check are accepted, as torch does.
    Unlike torch, which skips the type check for ``X | None``, ``Literal[...]`` and other
    generic types, these are checked here."""
    members = union_members(declared)
    checkable = [m for m in members if m is type(None) or isinstance(m, type) or _is_literal(m)]
    if len(checkable) < len(members):
        return True  # a callable, a list[...] or a class torch checks itself
    for member in checkable:
        if _is_literal(member):
            if any(value == arg and type(value) is type(arg) for arg in typing.get_args(member)):
                return True
        elif member is float:  # torch refuses a whole number for a float setting
            if isinstance(value, float):
                return True
        elif member is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return True
        elif isinstance(value, member):
            return True
    return False


def _is_literal(kind: Any) -> bool:
    return typing.get_origin(kind) is typing.Literal


def _type_text(declared: Any) -> str:
    parts = []
    for member in union_members(declared):
        if member is type(None):
            parts.append("null")
        elif _is_literal(member):
            parts.append("one of " + ", ".join(map(repr, typing.get_args(member))))
        elif member in _SCALARS or member is str:
            parts.append(
                {bool: "a boolean", int: "a whole number", float: "a decimal number (1.0)"}.get(
                    member, "a string"
                )
            )
        else:
            parts.append(describe(member).strip("<>'").removeprefix("class '"))
    return " or ".join(parts)


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "a whole number"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    return f"a {type(value).__name__}"


# --- fields an automatically found ./torchkiln.yaml may not set ---------------------------------

CODE_LOADING_FIELDS = {
    "store": "torchkiln and inductor load compiled code and pickled functions from this directory",
    "cache_dir": "inductor loads compiled code from this directory",
    "job.store": "torchkiln loads pickled compiled functions from this directory",
    "artifacts": "torchkiln loads pickled compiled functions from this directory",
    "distributed.deepspeed.config": "DeepSpeed reads this JSON file, and its settings can make "
    "DeepSpeed import modules",
}
"""Paths whose contents torch, torchkiln or DeepSpeed turn into running code."""


def unnamed_file_problems(
    values: Mapping[str, Any], sources: Mapping[str, str], file_source: str
) -> list[ConfigProblem]:
    """Problems for every code-loading path set by a file nobody named (``./torchkiln.yaml``
    found in the working directory). Naming the file, the environment and Python are explicit
    choices and may set them."""
    problems = []
    for path, why in CODE_LOADING_FIELDS.items():
        if sources.get(path) != file_source:
            continue
        value: Any = values
        for part in path.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        if not isinstance(value, str):
            continue  # null, or DeepSpeed's configuration inline (checked by value_checks)
        problems.append(
            ConfigProblem(
                f"$.{path}",
                f"{describe(value)}: {why}, so a torchkiln.yaml found in the working directory "
                "(nobody named it) may not set it; name the file (torchkiln.compile(model, "
                "'torchkiln.yaml') or TORCHKILN_CONFIG=torchkiln.yaml), or set it from the "
                f"environment or Python, see {_DOCS}",
                file_source,
            )
        )
    return problems
