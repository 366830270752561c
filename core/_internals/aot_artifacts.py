"""torch's saved compiled functions: what torchkiln reads of ``aot_compile`` results and of what
``torch.compiler.load_compiled_function`` returns.

Both are ``torch._dynamo.aot_compile.AOTCompiledFunction`` objects. Their public surface (call,
``save_compiled_function``) runs the guards and raises on a miss; torchkiln needs the guards and
the function apart, to try several saved functions in turn and say why none fits
(:class:`~torchkiln._internals.cache_entries.GuardTable`), and the names the function's bytecode
loads, to supply them in another process.

The contract tests need ``aot_compile``, which torch 2.11 lacks (the features that need it are
refused there by :mod:`torchkiln._internals.versions`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from torchkiln._internals.cache_entries import GuardTable


def loaded_guard_table(functions: Iterable[Any]) -> GuardTable[Callable[..., Any]]:
    """Saved compiled functions as a :class:`GuardTable`: each row the function's reconstructed
    guards and its bytecode as a plain function (called like the function that was compiled,
    with no guard check of its own), in the order given.

    Reads ``AOTCompiledFunction._artifacts.guard_manager`` (rebuilt from the saved guard state
    when loaded) and ``AOTCompiledFunction.fn``: the object's call checks the guards and raises
    on a miss, and no public API returns the guards or the unchecked function. Verified: torch
    2.13, 2.14, 2.15.
    """
    return GuardTable((function._artifacts.guard_manager, function.fn) for function in functions)


_MODULE_GLOBAL = "___module_"
"""How Dynamo names a global it installs for a module its bytecode loads
(``PyCodegen.create_load_python_module``: ``___module_<name>_<id>``)."""


def installed_module_globals(aot: Any, runtime_globals: dict[str, Any]) -> dict[str, str]:
    """For an ``aot_compile`` result: the global names Dynamo installed in ``runtime_globals``
    (the compiled function's module globals) for modules its bytecode loads, each with the name
    of the module it holds. torch records the modules it imports under its own aliases
    (``__import_*``) with the artifact, but not these: a loading process supplies them.

    Reads ``AOTCompiledFunction._artifacts.runtime_env.external_refs`` (every global the
    bytecode loads) and Dynamo's naming of module globals: no public API lists the globals a
    saved function needs. Verified: torch 2.13, 2.14, 2.15.
    """
    found = {}
    for ref in aot._artifacts.runtime_env.external_refs:
        name = getattr(runtime_globals.get(ref), "__name__", None)
        if ref.startswith(_MODULE_GLOBAL) and isinstance(name, str):
            found[ref] = name
    return found
