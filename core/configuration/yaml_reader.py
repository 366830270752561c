"""Read a torchkiln YAML file: any input becomes plain data or one :class:`ConfigError` naming
the field path (``$.a.b``) and the line. PyYAML's safe loader, extended: its composer limits
depth and size, and the composed graph (aliases as shared nodes) is checked before anything is
constructed, so an alias bomb is refused after one look at each distinct node. What is refused,
with examples: docs/configuration.md, "A YAML file".
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from torchkiln.configuration.config_values import (
    MAX_DEPTH,
    MAX_VALUES,
    PlainValueError,
    config_error,
    describe,
    join_path,
    plain_tree,
)

MAX_FILE_BYTES = 1024 * 1024
"""Largest configuration file read (1 MiB)."""

_TAG = "tag:yaml.org,2002:"
_SCALAR_TAGS = {f"{_TAG}{name}" for name in ("str", "int", "float", "bool", "null")}
_MERGE = f"{_TAG}merge"
_TAG_NAMES = {
    f"{_TAG}timestamp": "a date/time (YAML reads 2024-01-31 as a date; quote it for a string)",
    f"{_TAG}binary": "binary data (!!binary)",
    f"{_TAG}set": "a set (!!set)",
    f"{_TAG}omap": "an ordered mapping (!!omap)",
    f"{_TAG}pairs": "a list of pairs (!!pairs)",
    f"{_TAG}value": "a YAML value key (=)",
    f"{_TAG}merge": "a merge key (<<) outside a mapping key",
}
_KEY_KINDS = {
    f"{_TAG}int": "a whole number",
    f"{_TAG}float": "a number",
    f"{_TAG}bool": "a boolean (YAML 1.1 reads on/off/yes/no as booleans)",
    f"{_TAG}null": "null",
}
_JSON_LIKE = "only mappings with string keys, lists, strings, numbers, booleans and null"


class _Refused(Exception):
    """Raised inside the loader; becomes a ConfigProblem."""

    def __init__(self, path: str, message: str, node: Node | None = None):
        line = f" (line {node.start_mark.line + 1})" if node is not None else ""
        super().__init__(message + line)
        self.path = path
        self.message = message + line


# --- reading the bytes -------------------------------------------------------------------------


def read_config_text(path: Path, where: str, what: str = "config file") -> str:
    """The text of a regular file of at most :data:`MAX_FILE_BYTES`, decoded as UTF-8;
    ``what`` names the file in messages (``cannot read {what}: ...``)."""
    try:
        data = _read_regular_file(path)
    except (OSError, ValueError) as error:  # ValueError: a NUL byte in the path
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise config_error(where, f"cannot read {what}: {reason}") from None
    if data is None:
        raise config_error(where, _not_regular(path, what))
    if len(data) > MAX_FILE_BYTES:
        raise config_error(
            where,
            f"the file is larger than {MAX_FILE_BYTES // 1024} KiB; a torchkiln configuration "
            "is far smaller",
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise config_error(
            where,
            f"the file is not UTF-8 text: byte {data[error.start]:#04x} at offset {error.start} "
            f"(line {line}); save it as UTF-8",
        ) from None


def _read_regular_file(path: Path) -> bytes | None:
    """At most ``MAX_FILE_BYTES + 1`` bytes, or None when ``path`` is not a regular file."""
    # Checked before opening: opening a FIFO for reading blocks until a writer comes.
    if not stat.S_ISREG(os.stat(path).st_mode):
        return None
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):  # replaced meanwhile
            return None
        return handle.read(MAX_FILE_BYTES + 1)


def _not_regular(path: Path, what: str) -> str:
    kind = "a directory" if path.is_dir() else "not a regular file (a device, FIFO or socket)"
    return f"cannot read {what}: {str(path)!r} is {kind}"


# --- parsing -----------------------------------------------------------------------------------


class _LimitedLoader(yaml.SafeLoader):
    """The safe loader with a path-tracking, depth- and count-limited composer."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._path = ["$"]
        self._composed = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        # ``index``: an item's position in a sequence, a value's key node; None for the root
        # and for a mapping key, which share their parent's path
        path = self._path[-1] if index is None else _child_path(self._path[-1], index)
        self._composed += 1
        if self._composed > MAX_VALUES:
            raise _Refused(path, f"more than {MAX_VALUES} values; a torchkiln file is far smaller")
        if len(self._path) > MAX_DEPTH:
            raise _Refused(path, f"nested deeper than {MAX_DEPTH} levels")
        self._path.append(path)
        try:
            return super().compose_node(parent, index)
        finally:
            self._path.pop()


def parse_yaml(text: str, where: str) -> Any:
    """Plain data from YAML text, or a ConfigError (source ``where``) naming the field path."""
    try:
        loader = _LimitedLoader(text)
    except yaml.YAMLError as error:  # characters YAML does not allow (NUL, ...)
        raise config_error(where, _yaml_message(error)) from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_graph(node)
        data = loader.construct_document(node)
    except _Refused as error:
        raise config_error(where, error.message, error.path) from None
    except yaml.YAMLError as error:
        raise config_error(where, _yaml_message(error)) from None
    except Exception as error:
        # PyYAML's constructors fail on some scalars with plain Python errors (``!!int ''``
        # raises IndexError); after the checks above, whatever they raise is bad input.
        cause = f"{type(error).__name__}: {describe(str(error))}"
        raise config_error(where, f"not valid YAML: a value cannot be read ({cause})") from None
    finally:
        loader.dispose()
    try:
        return plain_tree(data)
    except PlainValueError as error:
        raise config_error(where, error.message, error.path) from None


def _yaml_message(error: yaml.YAMLError) -> str:
    """What is wrong and where (line, column), without PyYAML's snippet of the file: the
    file may not be a torchkiln configuration at all, and its lines are not ours to print."""
    if not isinstance(error, yaml.MarkedYAMLError):
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        return f"not valid YAML: {first[:200]}"
    parts = []
    for text, mark in ((error.context, error.context_mark), (error.problem, error.problem_mark)):
        if text:
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
            parts.append(f"{text[:200]}{where}")
    return "not valid YAML: " + ("; ".join(parts) or "malformed")


def _check_graph(root: Node) -> None:
    """Check every distinct node once: allowed tags, string keys without duplicates, depth and
    size with aliases expanded, no alias cycle. Iterative: nothing here recurses."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    active: set[int] = set()
    stack: list[tuple[Node, str, bool]] = [(root, "$", False)]
    while stack:
        node, path, finished = stack.pop()
        key = id(node)
        children = _children(node, path)
        if finished:
            active.discard(key)
            size[key] = 1 + sum(size[id(child)] for child, _ in children)
            depth[key] = 1 + max((depth[id(child)] for child, _ in children), default=0)
            if size[key] > MAX_VALUES:
                raise _Refused(
                    path,
                    f"expands to more than {MAX_VALUES} values (YAML aliases count once per "
                    "use); a torchkiln file is far smaller",
                    node,
                )
            if depth[key] > MAX_DEPTH:
                raise _Refused(
                    path, f"nested deeper than {MAX_DEPTH} levels (aliases expanded)", node
                )
            continue
        if key in size:
            continue
        if key in active:
            raise _Refused(path, "a YAML alias refers to a node that contains it", node)
        _check_node(node, path)
        active.add(key)
        stack.append((node, path, True))
        stack.extend((child, child_path, False) for child, child_path in children)


def _children(node: Node, path: str) -> list[tuple[Node, str]]:
    if isinstance(node, SequenceNode):
        return [(child, join_path(path, index)) for index, child in enumerate(node.value)]
    if isinstance(node, MappingNode):
        pairs = []
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE:  # ``<<: *base``: the merged mapping is the child
                pairs.append((value_node, path))
                continue
            pairs.append((key_node, path))
            pairs.append((value_node, _child_path(path, key_node)))
        return pairs
    return []


def _child_path(path: str, key: int | Node) -> str:
    """The path of a sequence item (``key``: its index) or of a mapping value (its key node)."""
    if isinstance(key, Node):
        return join_path(path, key.value if isinstance(key, ScalarNode) else "<complex key>")
    return join_path(path, key)


def _check_node(node: Node, path: str) -> None:
    if isinstance(node, ScalarNode):
        if node.tag not in _SCALAR_TAGS:
            raise _Refused(path, _tag_message(node), node)
        if node.tag == f"{_TAG}int" and len(node.value) > 40:
            raise _Refused(
                path,
                f"a whole number of {len(node.value)} characters does not fit in 64 bits",
                node,
            )
        return
    expected = f"{_TAG}seq" if isinstance(node, SequenceNode) else f"{_TAG}map"
    if node.tag != expected:
        raise _Refused(path, _tag_message(node), node)
    if isinstance(node, MappingNode):
        _check_keys(node, path)


def _check_keys(node: MappingNode, path: str) -> None:
    seen: dict[str, int] = {}
    for key_node, _ in node.value:
        if not isinstance(key_node, ScalarNode):
            raise _Refused(
                path,
                "a complex key (a list or mapping used as a key, as in '? [a]: 1') is not "
                "allowed; keys must be strings",
                key_node,
            )
        if key_node.tag == _MERGE:
            continue
        if key_node.tag != f"{_TAG}str":
            kind = _KEY_KINDS.get(key_node.tag, _tag_message(key_node))
            raise _Refused(
                path,
                f"key {describe(key_node.value)} is read as {kind}; keys must be strings, "
                f"quote it: '{key_node.value}'",
                key_node,
            )
        line = key_node.start_mark.line + 1
        if key_node.value in seen:
            raise _Refused(
                join_path(path, key_node.value),
                f"duplicate key {describe(key_node.value)} (lines {seen[key_node.value]} and "
                f"{line}); give each key once",
            )
        seen[key_node.value] = line


def _tag_message(node: Node) -> str:
    what = _TAG_NAMES.get(node.tag) or f"the YAML tag {describe(node.tag)}"
    return f"{what} is not allowed: torchkiln reads YAML with a safe loader, {_JSON_LIKE}"


# --- the whole file ----------------------------------------------------------------------------


def read_yaml_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A torchkiln YAML file as a plain mapping; any problem is one :class:`ConfigError`.

    Nothing is filtered for safety here: the result passed back to
    :func:`torchkiln.compile` as its ``config`` mapping counts as a Python argument, which is
    how a trusted file may set options that run programs (docs/configuration.md).
    """
    path = Path(path)
    where = f"file:{path}"
    data = parse_yaml(read_config_text(path, where), where)
    if data is None:
        return {}
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise config_error(where, f"the top level must be a mapping of fields, got a {kind}")
    return data
