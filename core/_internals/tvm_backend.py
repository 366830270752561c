"""torch's own ``tvm`` Dynamo backend (``torch/_dynamo/backends/tvm.py``): which TVM frontend it
compiles through.

Nothing here imports ``tvm``; torch is imported inside the functions.
"""

from __future__ import annotations

import dis
import inspect
from collections.abc import Callable
from types import CodeType
from typing import Any, Literal

TvmFrontend = Literal["relax", "relay", "unknown"]
"""``relay``: the backend imports ``tvm.relay`` (TorchScript trace, ``relay.build``, graph
executor; options ``scheduler``, ``trials``, ``opt_level``). ``relax``: it imports
``tvm.relax.frontend.torch`` and hands the graph to ``relax_dynamo`` (option ``pipeline``).
``unknown``: it imports neither, a torch release this module does not know yet."""


def imported_names(fn: Callable[..., Any]) -> frozenset[str]:
    """The dotted names ``fn``'s code imports, with those of the functions nested in it, once
    ``functools.wraps`` layers are unwrapped: ``from tvm.contrib import graph_executor`` gives
    ``tvm.contrib`` and ``tvm.contrib.graph_executor``, ``import tvm`` gives ``tvm``.

    Reads the ``IMPORT_NAME`` and ``IMPORT_FROM`` instructions of the code object (``dis``),
    public Python; the private part is what torch's backend code imports, which it documents
    nowhere else. A callable without Python code (a C function, a class) imports nothing here.
    """
    code = getattr(inspect.unwrap(fn), "__code__", None)
    return frozenset(_code_imports(code)) if isinstance(code, CodeType) else frozenset()


def _code_imports(code: CodeType) -> set[str]:
    names: set[str] = set()
    module = ""
    for instruction in dis.get_instructions(code):
        if instruction.opname == "IMPORT_NAME":
            module = str(instruction.argval)
            names.add(module)
        elif instruction.opname == "IMPORT_FROM" and module:
            names.add(f"{module}.{instruction.argval}")
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            names |= _code_imports(constant)
    return names


def torch_tvm_frontend() -> TvmFrontend | None:
    """The TVM frontend torch's registered ``tvm`` backend compiles through: ``"relay"`` (torch
    up to 2.13), ``"relax"`` (torch 2.14 on), ``"unknown"`` when its code imports neither, or
    ``None`` when this torch registers no ``tvm`` backend.

    Looks the backend up with ``torch._dynamo.lookup_backend("tvm")`` (after the public
    ``torch.compiler.list_backends`` says torch has one) and reads the imports of its code
    (:func:`imported_names`, through the ``fake_tensor_unsupported`` wrapper): neither torch nor
    TVM says which frontend the backend uses, and reading its code, rather than comparing
    version numbers, follows a torch that backports or reverts the change. Imports no ``tvm``:
    torch's backend imports it only when it compiles. Verified: torch 2.11, 2.13 (relay), 2.14, 2.15
    (relax).
    """
    import torch.compiler

    if "tvm" not in torch.compiler.list_backends(exclude_tags=()):
        return None
    from torchkiln._internals import dynamo

    names = imported_names(dynamo.lookup_backend("tvm"))
    if any(name == "tvm.relax" or name.startswith("tvm.relax.") for name in names):
        return "relax"
    if any(name == "tvm.relay" or name.startswith("tvm.relay.") for name in names):
        return "relay"
    return "unknown"
