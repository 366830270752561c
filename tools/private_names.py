"""List every private name of another library that torchkiln's code touches outside its adapter.

A private name here is one that starts with an underscore (not a dunder) and that torchkiln's own
code never defines: an attribute read or written (``x._stance``), a name given as a string to
``getattr``/``setattr``/``hasattr``/``delattr``, a private module imported (``torch._dynamo``) or
a private name imported from a module. A name the same file defines (functions, classes,
assignments, arguments, ``self._x = ...``) is its own and passes; a name defined in another file
does not (a ``self._orig_mod`` somewhere must not let ``model._orig_mod`` pass everywhere), nor
one the adapter sets on another library's object (``KernelTemplate._template_from_string``). :data:`ALLOWED` lists the few private names of the standard library that pass.

Only ``core/_internals/`` (``torchkiln._internals``) may touch them: that package is the one adapter
between torchkiln and the private parts of torch, transformers and accelerate. Run by ``tox -e
lint``; exits 1 and prints ``file:line: name`` for each use found elsewhere.

Usage: ``python tools/private_names.py [DIR ...]`` (default: ``core plugins``).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ADAPTER = Path("core/_internals")
ATTRIBUTE_CALLS = {"getattr", "setattr", "hasattr", "delattr"}
PRIVATE_ROOTS = ("torch", "transformers", "accelerate", "deepspeed")
ALLOWED = frozenset({("sys", "_getframe")})
"""``(module, name)`` pairs read as ``module.name`` that pass anywhere: ``sys._getframe`` is
CPython's documented frame accessor (the standard library's, not torch's; ``inspect``'s public
``currentframe`` is the same function), which Dynamo's callers are found with."""


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def defined_names(tree: ast.AST) -> set[str]:
    """Every name a module defines: what it declares, assigns, imports or takes as an argument."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.Call) and _call_name(node) == "setattr" and len(node.args) > 1:
            name = node.args[1]
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                names.add(name.value)
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)
    return names


def _call_name(node: ast.Call) -> str | None:
    return node.func.id if isinstance(node.func, ast.Name) else None


def _module_is_private(module: str) -> bool:
    parts = module.split(".")
    return parts[0] in PRIVATE_ROOTS and any(is_private(part) for part in parts[1:])


def used_private_names(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, name) for each private name a module reads, imports or names in a string."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            if (owner, node.attr) not in ALLOWED:
                yield node.lineno, node.attr
        elif (
            isinstance(node, ast.Call)
            and _call_name(node) in ATTRIBUTE_CALLS
            and len(node.args) > 1
        ):
            name = node.args[1]
            if (
                isinstance(name, ast.Constant)
                and isinstance(name.value, str)
                and is_private(name.value)
            ):
                yield node.lineno, name.value
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _module_is_private(alias.name):
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if _module_is_private(node.module):
                yield node.lineno, node.module
            elif node.module.split(".")[0] in PRIVATE_ROOTS:
                for alias in node.names:
                    if is_private(alias.name):
                        yield node.lineno, f"{node.module}.{alias.name}"


def main(argv: list[str]) -> int:
    roots = [Path(arg) for arg in argv] or [Path("core"), Path("plugins")]
    files = sorted(path for root in roots for path in root.rglob("*.py"))
    trees = {path: ast.parse(path.read_text(), str(path)) for path in files}
    found = [
        f"{path}:{line}: {name}"
        for path, tree in trees.items()
        if ADAPTER not in path.parents
        for line, name in sorted(set(used_private_names(tree)))
        if "." in name or name not in defined_names(tree)
    ]
    for line in found:
        print(line)
    if found:
        print(
            f"{len(found)} uses of private names of torch, transformers, accelerate or DeepSpeed "
            f"outside {ADAPTER}/: move each behind a named function there (docs/internals.md)",
            file=sys.stderr,
        )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
