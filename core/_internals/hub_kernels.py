"""Hugging Face ``kernels``' function modules: made findable by name, so that torch can save code
that calls them, and stepped around where they would keep a nested block from being reused.

transformers 5.25 depends on ``kernels``, and ``@use_kernel_forward_from_hub`` on a function
(Llama's ``apply_rotary_pos_emb``, say) replaces it with an instance of a class made inside
``kernels``' ``_create_func_module``: its ``__qualname__`` is
``_create_func_module.<locals>.Func``. torch refuses to save any compiled code that meets such a
class ("cannot be saved into torch.compile() package since it's defined in local scope"; the
FX graph pickler: "Can't pickle local object"), so every saved region entry, precompiled
directory and whole-model form of a transformers model failed. The instance itself is a module
global, and ``kernels`` pickles it by that name; only its class had no name to be found by.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

LOCAL_FUNC_CLASS = "_create_func_module.<locals>.Func"
"""The ``__qualname__`` ``kernels`` gives each function module's class."""


def name_function_modules(module_names: Iterable[str]) -> list[str]:
    """Give each ``kernels`` function module that the Python modules ``module_names`` hold as
    globals a class name pickle resolves: ``<module>.<function>.__class__`` (the global, then its
    class). Returns the names it gave, ``module.function`` each; idempotent; imports nothing.

    Sets ``__name__`` and ``__qualname__`` of classes ``kernels`` made in its private
    ``_create_func_module`` (nothing in ``kernels`` reads either: it pickles the instance by its
    function's name, and ``kernelize`` finds the layer by ``kernel_layer_name``). Both names,
    because Dynamo's ``TYPE_MATCH`` guard is saved only for a class whose name and qualified
    name agree. A class is renamed only where the global resolves back to the same object from
    the class's own module, which is what pickle will check. Verified: torch 2.11, 2.13, 2.15
    (kernels 0.19.1, transformers 5.25).
    """
    named: list[str] = []
    for module_name in sorted(set(module_names)):
        module = sys.modules.get(module_name)
        for name, value in list(vars(module).items()) if module is not None else ():
            kind = type(value)
            if kind.__qualname__ != LOCAL_FUNC_CLASS:
                continue
            home = sys.modules.get(kind.__module__)
            if home is None or getattr(home, name, None) is not value:
                continue
            kind.__name__ = kind.__qualname__ = f"{name}.__class__"
            named.append(f"{kind.__module__}.{name}")
    return named


def unrouted_forward(module: Any) -> Callable[..., Any] | None:
    """The forward ``module``'s class had before ``kernels``' ``@use_kernelized_func`` wrapped
    it, bound to ``module``; ``None`` where the class was not wrapped so or where a kernel was
    installed (``kernelize``), so that the wrapper's routing matters.

    The wrapper puts this module's function wrappers in a process-wide context variable for
    the duration of the call. Under Dynamo that is a store to a global object inside the
    block, so a ``nested_compile_region`` around the block is never reused ("subgraph has side
    effects"). With no kernel installed, every routed call ends in the plain function, which
    is what the original forward calls: the two are the same computation. Reads
    ``module._kernel_funcs`` (the wrappers ``use_kernelized_func`` gives each instance) and
    each wrapper's instance ``forward`` (where ``kernelize`` installs a kernel).
    Verified: torch 2.11, 2.13, 2.15 (kernels 0.19.1, transformers 5.25).
    """
    wrappers = vars(module).get("_kernel_funcs")
    original = getattr(type(module).forward, "__wrapped__", None)
    if not isinstance(wrappers, dict) or not callable(original):
        return None
    if any("forward" in vars(wrapper) for wrapper in wrappers.values()):
        return None
    return types.MethodType(original, module)
