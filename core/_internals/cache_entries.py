"""Dynamo's cache entries and guards: what torchkiln reads to run, explain or attribute compiled code.

Dynamo keeps, per code object, a list of cache entries: each a guard manager (torch's C++ check
of everything the trace assumed: shapes, dtypes, grad mode, attribute values) and the compiled
bytecode to run when it passes. Saved functions (``torch.compiler.load_compiled_function``,
:mod:`torchkiln._internals.aot_artifacts`) carry the same pair. :class:`GuardTable` is the one
implementation torchkiln has of "find the first compiled function whose guards pass for these
frame locals, or say which guard failed"; the rest of this module reads Dynamo's state around it
(cache entries, compile-start callbacks, guard names).

Nothing here imports ``torch._dynamo`` until a function is called.
"""

from __future__ import annotations

import re
import sys
import threading
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

Check = Callable[[dict[str, Any]], bool]
"""A guard check: ``check(frame_locals)`` is true when every guard passes."""

F = TypeVar("F")
"""What a row of a :class:`GuardTable` holds: the function to run when its guards pass."""

UNEXPLAINED = "guards failed ({error})"
""":meth:`GuardTable.first_failures`' text for a row whose explanation itself raised."""


class GuardTable(Generic[F]):
    """Compiled functions, each behind the guards it was compiled under, tried in order.

    Built from ``(guards, function)`` pairs where ``guards`` is one of torch's guard managers
    (``torch._dynamo.guards.GuardManagerWrapper`` or a ``RootGuardManager``: ``check(f_locals)``
    and ``check_verbose(f_locals)``). Iterating gives ``(check, function)`` rows.

    Reads the guard managers' ``check``, ``check_verbose`` (a ``GuardDebugInfo`` with ``result``
    and ``verbose_code_parts``) and ``diff_guard_root``: torch runs guards only inside its frame
    evaluation and ``AOTCompiledFunction.__call__``, neither of which can be asked "which of these
    functions fits" or "why not" without running or raising. Verified: torch 2.11, 2.13, 2.14,
    2.15.
    """

    __slots__ = ("_guards", "_rows")

    def __init__(self, pairs: Iterable[tuple[Any, F]] = ()):
        pairs = list(pairs)
        self._guards: list[Any] = [guards for guards, _ in pairs]
        self._rows: list[tuple[Check, F]] = [(guards.check, function) for guards, function in pairs]

    def find(self, frame_locals: dict[str, Any]) -> F | None:
        """The first function whose guards pass for ``frame_locals``; ``None`` on a miss."""
        for check, function in self._rows:
            if check(frame_locals):
                return function
        return None

    def first_failures(
        self, frame_locals: dict[str, Any], unexplained: str | None = UNEXPLAINED
    ) -> list[str | None]:
        """Per row: ``None`` when its guards pass, else the first guard that fails, in torch's
        words. When torch's explanation raises, :data:`UNEXPLAINED` with the error's type
        (``unexplained=None``: ``None``, the row left out of the explanation)."""
        return [_first_failure(guards, frame_locals, unexplained) for guards in self._guards]

    def covered_calls(self) -> list[str]:
        """Per row, the call family its guards admit: each argument tensor's dtype and size
        (``*`` for a dimension Dynamo left dynamic), ``args[0] float32[1, 12]``; ``?`` where
        torch keeps no text of a row's guards.

        Reads the guard managers' ``code_parts``, the text of each guard (``check_tensor(L[...],
        ..., size=[None, 3], ...)``): torch has no structured view of what a compiled entry
        admits. Verified: torch 2.11, 2.13, 2.14, 2.15.
        """
        return [_call_family(getattr(guards, "code_parts", None)) for guards in self._guards]

    def __iter__(self) -> Iterator[tuple[Check, F]]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)


_TENSOR_GUARD = re.compile(
    r"check_tensor\(L\['(?P<root>args|kwargs)'\]\[(?P<key>[^\]]+)\], Tensor, .*?, "
    r"torch\.(?P<dtype>\w+), .*?size=\[(?P<size>[^\]]*)\]"
)


def _call_family(code_parts: Any) -> str:
    """``args[0] float32[1, *, 64], kwargs['mask'] bool[1, 8]`` from a row's guard texts."""
    if not code_parts:
        return "?"
    found = {}
    for part in code_parts:
        match = _TENSOR_GUARD.search(str(part))
        if match is not None:
            size = ", ".join(
                "*" if dim.strip() == "None" else dim.strip() for dim in match["size"].split(",")
            )
            found[f"{match['root']}[{match['key']}]"] = f"{match['dtype']}[{size}]"
    return ", ".join(f"{name} {spec}" for name, spec in found.items()) or "no tensor arguments"


def _first_failure(
    guards: Any, frame_locals: dict[str, Any], unexplained: str | None
) -> str | None:
    try:
        info = guards.check_verbose(frame_locals)
    except Exception as error:  # an explanation must never break the call
        return None if unexplained is None else unexplained.format(error=type(error).__name__)
    if info.result:
        return None
    return str((getattr(info, "verbose_code_parts", None) or [info])[0])


def dynamo_guard_table(
    code: types.CodeType, as_function: Callable[[types.CodeType], F]
) -> GuardTable[F]:
    """Dynamo's cache entries for ``code`` now, as a :class:`GuardTable` whose rows run
    ``as_function(entry's compiled bytecode)``. The table keeps each entry's guard manager and
    code, never the entry itself (Dynamo frees entries on reset and recompile).

    Reads ``torch._C._dynamo.eval_frame._debug_get_cache_entry_list`` and each entry's ``code``
    and ``guard_manager``: torch exposes a code object's compiled entries only through this
    debugging function. Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list

    return GuardTable(
        (entry.guard_manager, as_function(entry.code))
        for entry in _debug_get_cache_entry_list(code)
    )


_RESUME_IN = "torch_dynamo_resume_in_"
"""How the ``co_name`` of such a function starts (``TORCH_DYNAMO_RESUME_IN_PREFIX``), followed by
the continued function's name and ``_at_<line>``."""


def resumed_function_name(co_name: str) -> str:
    """The name of the function a resume function continues (``forward`` for
    ``torch_dynamo_resume_in_forward_at_12``); any other name unchanged.

    Reads Dynamo's naming of resume functions (``TORCH_DYNAMO_RESUME_IN_PREFIX``): no public API
    maps a resume function to its origin. Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    if co_name.startswith(_RESUME_IN):
        return co_name[len(_RESUME_IN) :].rsplit("_at_", 1)[0]
    return co_name


def frame_being_compiled() -> tuple[types.CodeType, dict[str, Any]] | None:
    """The code and locals of the frame Dynamo is compiling now on this thread (called from a
    compile-start callback, :func:`on_compile`), or ``None``.

    Reads ``sys._getframe`` and the ``code`` and ``locals`` arguments of Dynamo's
    ``torch._dynamo.convert_frame._compile`` on the stack: a compile-start callback is given
    the compile id only, not the frame. Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_compile":
            f_locals = frame.f_locals
            code, frame_locals = f_locals.get("code"), f_locals.get("locals")
            if isinstance(code, types.CodeType) and isinstance(frame_locals, dict):
                return code, frame_locals
        frame = frame.f_back
    return None


_callbacks_lock = threading.Lock()
_wrappers: dict[Callable[[str], None], Callable[[Any], None]] = {}


def _wrapper_of(callback: Callable[[str], None]) -> Callable[[Any], None]:
    """The function Dynamo calls for ``callback``, made once (registering it again is then
    seen as done): it passes ``callback`` the compile id only."""

    def wrapper(args: Any) -> None:
        try:
            compile_id = str(getattr(args, "compile_id", "") or "")
        except Exception:  # an observer never breaks a compile
            return
        callback(compile_id)

    _wrappers[callback] = wrapper
    return wrapper


def on_compile(start: Callable[[str], None], end: Callable[[str], None]) -> None:
    """Have Dynamo call ``start(compile_id)`` when it starts compiling a frame, before it
    traces, and ``end(compile_id)`` when that compile ends, also when it fails (for the
    outermost compile only: one that starts inside another calls neither). Idempotent; call
    it again after ``torch._dynamo.reset()``, which drops Dynamo's callbacks.

    Reads ``torch._dynamo.callback_handler`` (``start_callbacks``, ``end_callbacks``, their
    ``register_*`` methods, which ``install_callbacks`` runs around ``_compile_inner``) and the
    ``compile_id`` of the arguments it passes: torch has no public compile-start hook.
    Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    import torch._dynamo

    with _callbacks_lock:
        handler = torch._dynamo.callback_handler
        for callback, registered, register in (
            (start, handler.start_callbacks, handler.register_start_callback),
            (end, handler.end_callbacks, handler.register_end_callback),
        ):
            wrapper = _wrappers.get(callback) or _wrapper_of(callback)
            if wrapper not in registered:
                register(wrapper)


def mark_dynamic(tensor: Any, dims: list[int]) -> None:
    """Mark ``dims`` of ``tensor`` dynamic for the next trace that sees it.

    Calls ``torch._dynamo.mark_dynamic``: the documented API, which torch keeps under
    ``torch._dynamo`` (``torch.compiler`` has no counterpart). Verified: torch 2.11, 2.13,
    2.14, 2.15.
    """
    import torch._dynamo

    torch._dynamo.mark_dynamic(tensor, dims)


_GUARD_SUBMODULE = re.compile(r"_modules\['([^']+)'\]")
_GUARD_IMPORT = re.compile(r"G\['__import_([A-Za-z0-9_]+)'\]")


def guard_submodule_path(guard_name: str, root: str = "module") -> str | None:
    """``module._modules['model']._modules['layers']._modules['0']`` -> ``model.layers.0``
    (``""`` for ``root`` itself); ``None`` when a guard's source name is not a plain chain of
    submodules of ``root``.

    Reads Dynamo's source names of guards (``GuardFilterEntry.name``), which spell submodule
    access through ``nn.Module._modules``: the guard filter gets names, not sources. Verified:
    torch 2.11, 2.13, 2.14, 2.15.
    """
    if not guard_name.startswith(root):
        return None
    rest = guard_name.removeprefix(root)
    parts = _GUARD_SUBMODULE.findall(rest)
    if rest != "".join(f"._modules['{p}']" for p in parts):
        return None
    return ".".join(parts)


def guard_imported_modules(guard_name: str) -> list[str]:
    """The Python modules a guard's source name reaches through Dynamo's import aliases
    (``G['__import_transformers_dot_masking_utils']`` -> ``transformers.masking_utils``).

    Reads Dynamo's alias naming (``InstructionTranslator.import_source``: ``__import_`` and
    ``.`` spelled ``_dot_``): the guard filter gets names, not sources. Verified: torch 2.11,
    2.13, 2.14, 2.15.
    """
    return [alias.replace("_dot_", ".") for alias in _GUARD_IMPORT.findall(guard_name)]


def guard_checked_attribute(entry: Any) -> str | None:
    """The attribute name an attribute guard checks (``forward`` for a
    ``NOT_PRESENT_IN_GENERIC_DICT`` guard that the instance holds no ``forward``), or ``None``.

    Reads ``entry.orig_guard.create_fn.keywords`` (the guard builder method's bound arguments):
    a ``guard_filter_fn`` entry names the guarded object, not the attribute. Verified: torch
    2.11, 2.13, 2.14, 2.15.
    """
    create_fn = getattr(getattr(entry, "orig_guard", None), "create_fn", None)
    keywords = getattr(create_fn, "keywords", None) or {}
    attribute = keywords.get("attr")
    return attribute if isinstance(attribute, str) else None


def guard_kinds(entry: Any) -> set[str]:
    """A ``guard_filter_fn`` entry's guard type and the types derived from it (``ID_MATCH``,
    ``CLASS_MATCH``, ``NOT_PRESENT_IN_GENERIC_DICT``, ...): the public entry's fields, named by
    Dynamo's guard builder methods, which no API enumerates. Verified: torch 2.11, 2.13, 2.14,
    2.15."""
    return {entry.guard_type, *(entry.derived_guard_types or ())}


def unsavable_guard(entry: Any) -> bool:
    """Whether torch refuses to save a compiled function holding this ``guard_filter_fn``
    entry's guard (``PackageError: ID_MATCH guard cannot be serialized``): a guard on object
    identity, by its type or a type derived from it, ``TYPE_MATCH`` and ``BUILTIN_MATCH``
    excepted (torch saves those, by the class or builtin's name).

    Mirrors ``CheckFunctionManager.serialize_guards``' check and reads its
    ``UNSUPPORTED_SERIALIZATION_GUARD_TYPES``: no API says which guards torch can save.
    Verified: torch 2.11, 2.13, 2.14, 2.15.
    """
    from torch._dynamo.guards import CheckFunctionManager

    refused = CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES
    if entry.guard_type in ("TYPE_MATCH", "BUILTIN_MATCH"):
        return False
    return entry.guard_type in refused or any(
        kind in refused for kind in entry.derived_guard_types or ()
    )


def kept_by_aot_compile(entry: Any) -> bool:
    """Whether ``aot_compile`` keeps this ``guard_filter_fn`` entry's guard when it is given no
    filter of its own: it drops every guard on a global and every guard whose own type it
    cannot save (any filter given replaces that default).

    Mirrors the default filter ``torch._dynamo.aot_compile`` installs (``is_global`` and
    ``CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES``): torch names it nowhere
    public. Verified: torch 2.13, 2.14, 2.15 (2.11 has no ``aot_compile``).
    """
    from torch._dynamo.guards import CheckFunctionManager

    refused = CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES
    return not (entry.is_global or entry.guard_type in refused)


_GUARD_TYPE_OF = re.compile(r"(?:dict\()?type\((\w+(?:\._modules\['[^']+'\])*)(?:\.(\w+))?\)")


def guard_type_of(guard_name: str, root: str = "module") -> tuple[str, str | None] | None:
    """For a guard on what a class holds, reached through ``type()`` of ``root``, a submodule
    or an attribute of one (``dict(type(module._modules['attn'].processor).__dict__)
    ['__call__']``): ``(submodule path, attribute)`` (``("attn", "processor")``; attribute
    ``None`` for the module's own class). ``None`` for any other name.

    Reads Dynamo's source names (``TypeSource`` spelled ``type(...)``, a class dict read
    ``dict(type(...).__dict__)``): the guard filter gets names, not sources. Verified: torch
    2.11, 2.13, 2.14, 2.15.
    """
    found = _GUARD_TYPE_OF.match(guard_name)
    if found is None:
        return None
    path = guard_submodule_path(found.group(1), root)
    return None if path is None else (path, found.group(2))
