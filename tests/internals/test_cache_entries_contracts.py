"""Contracts of :mod:`torchkiln._internals.cache_entries`: one test per function or class, each
failing with the private name it reads when a torch release changes it.

Compiles only tiny functions with the ``eager`` backend (a few seconds in all).
"""

from __future__ import annotations

import inspect
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

from torchkiln._internals import cache_entries
from torchkiln._internals.cache_entries import GuardTable


def _as_function(function: types.FunctionType):
    """Rows run an entry's compiled bytecode as a function of ``function``'s globals."""

    def as_function(code: types.CodeType) -> types.FunctionType:
        return types.FunctionType(code, function.__globals__, function.__name__)

    return as_function


def _sine(x: torch.Tensor) -> torch.Tensor:
    return x.sin() + 1


def _compiled_table(function: types.FunctionType, *args) -> GuardTable[types.FunctionType]:
    torch._dynamo.reset()
    torch.compile(function, backend="eager", dynamic=False)(*args)
    return cache_entries.dynamo_guard_table(function.__code__, _as_function(function))


def test_dynamo_guard_table_finds_the_entry_a_call_fits_and_misses_another_shape() -> None:
    """``_debug_get_cache_entry_list``, each entry's ``code`` and ``guard_manager`` (``check``,
    ``check_verbose``)."""
    x = torch.randn(3)
    table = _compiled_table(_sine, x)
    assert len(table) == 1, "_debug_get_cache_entry_list did not list the compiled entry"
    ((check, compiled),) = table
    assert check({"x": x}) is True, "guard_manager.check rejected the call it was compiled for"
    found = table.find({"x": torch.randn(3)})
    assert found is compiled
    torch.testing.assert_close(found(x), _sine(x))
    assert table.find({"x": torch.randn(4)}) is None, "guard_manager.check passed another shape"
    assert table.first_failures({"x": x}) == [None]
    (failed,) = table.first_failures({"x": torch.randn(4)})
    assert isinstance(failed, str) and "x" in failed, (
        f"guard_manager.check_verbose(...).verbose_code_parts: {failed!r}"
    )


def test_first_failures_say_when_torch_cannot_explain() -> None:
    class Unexplained:
        def check(self, frame_locals: dict) -> bool:
            return False

        def check_verbose(self, frame_locals: dict) -> None:
            raise KeyError("x")

    table = GuardTable([(Unexplained(), _sine)])
    assert table.find({}) is None
    assert table.first_failures({}) == ["guards failed (KeyError)"]
    assert table.first_failures({}, unexplained=None) == [None]


def _breaks(x: torch.Tensor) -> torch.Tensor:
    x = x + 1
    torch._dynamo.graph_break()
    return x * 2


@pytest.fixture
def compile_starts() -> Iterator[list[tuple[str, str | None]]]:
    """``(compile id, name of the code being compiled)`` per compile start; each compile's end
    appends ``(compile id, "end")``."""
    seen: list[tuple[str, str | None]] = []

    def record(compile_id: str) -> None:
        found = cache_entries.frame_being_compiled()
        seen.append((compile_id, found[0].co_name if found is not None else None))

    def record_end(compile_id: str) -> None:
        seen.append((compile_id, "end"))

    torch._dynamo.reset()
    cache_entries.on_compile(record, record_end)
    cache_entries.on_compile(record, record_end)  # idempotent
    yield seen
    torch._dynamo.reset()  # drops the callbacks


def test_on_compile_passes_each_compile_id_once_at_its_start_and_end(compile_starts) -> None:
    """``torch._dynamo.callback_handler`` and its arguments' ``compile_id``."""
    torch.compile(_sine, backend="eager")(torch.randn(3))
    assert compile_starts == [("0/0", "_sine"), ("0/0", "end")]


_SCALE = {"value": 1.0}


def _scaled(x: torch.Tensor) -> torch.Tensor:
    return x * _SCALE["value"]


def test_on_compile_start_runs_before_dynamo_traces_and_end_after() -> None:
    """``install_callbacks`` runs around ``_compile_inner``: a setting made at the start holds
    while Dynamo traces (the value is folded into the graph), and is put back at the end."""

    def start(compile_id: str) -> None:
        _SCALE["value"] = 3.0

    def end(compile_id: str) -> None:
        _SCALE["value"] = 1.0

    torch._dynamo.reset()
    try:
        cache_entries.on_compile(start, end)
        out = torch.compile(_scaled, backend="eager")(torch.ones(2))
    finally:
        torch._dynamo.reset()
    assert out.tolist() == [3.0, 3.0] and _SCALE["value"] == 1.0


def test_frame_being_compiled_is_found_from_a_compile_start(compile_starts) -> None:
    """``sys._getframe`` and the ``code``/``locals`` arguments of ``convert_frame._compile``."""
    torch.compile(_sine, backend="eager")(torch.randn(3))
    assert [name for _, name in compile_starts if name != "end"] == ["_sine"]


def test_resumed_function_name_maps_a_resume_function_to_its_origin(compile_starts) -> None:
    """Dynamo's ``torch_dynamo_resume_in_<name>_at_<line>`` names."""
    torch.compile(_breaks, backend="eager")(torch.randn(2))
    names = [name for _, name in compile_starts if name != "end"]
    assert len(names) == 2 and names[0] == "_breaks", names
    assert names[1] != "_breaks" and cache_entries.resumed_function_name(names[1]) == "_breaks"
    assert cache_entries.resumed_function_name("_sine") == "_sine"


def test_mark_dynamic_compiles_one_entry_for_both_sizes() -> None:
    """``torch._dynamo.mark_dynamic``."""
    torch._dynamo.reset()
    first = torch.randn(3, 2)
    cache_entries.mark_dynamic(first, [0])
    compiled = torch.compile(_sine, backend="eager")
    compiled(first)
    compiled(torch.randn(5, 2))
    table = cache_entries.dynamo_guard_table(_sine.__code__, _as_function(_sine))
    assert len(table) == 1


_PROBE_MODULE = "torchkiln_guard_probe"
_PROBE_SOURCE = """
SCALE = 2.0

def helper(x):
    return x * SCALE
"""


class _Processor:
    """An object a module holds and calls, reading its signature (as diffusers' attention
    reads its processor's): Dynamo guards the class's ``__call__`` and its code."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


class _Probed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)
        self.processor = _Processor()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert "x" in inspect.signature(self.processor.__call__).parameters
        return self.processor(sys.modules[_PROBE_MODULE].helper(self.linear(x)))


def _whole(module: nn.Module, /, *args, **kwargs):
    return type(module).forward(module, *args, **kwargs)


_KINDS: list[tuple[str, set[str]]] = []
_SAVING: list[tuple[str, str, bool, bool]] = []
"""``(guard type, name, kept_by_aot_compile, unsavable_guard)`` of each guard of the probe."""


@pytest.fixture(scope="module")
def guard_names() -> list[tuple[str, str, str | None]]:
    """``(guard type, name, checked attribute)`` of every guard of a whole-module trace that
    calls a function of another (non-torch) module."""
    probe = types.ModuleType(_PROBE_MODULE)
    exec(_PROBE_SOURCE, probe.__dict__)
    sys.modules[_PROBE_MODULE] = probe
    seen: list[tuple[str, str, str | None]] = []

    def record(entries: list) -> list[bool]:
        for entry in entries:
            attribute = cache_entries.guard_checked_attribute(entry)
            seen.append((entry.guard_type, entry.name, attribute))
            _KINDS.append((entry.guard_type, cache_entries.guard_kinds(entry)))
            kept = cache_entries.kept_by_aot_compile(entry)
            _SAVING.append(
                (entry.guard_type, entry.name, kept, cache_entries.unsavable_guard(entry))
            )
        return [True] * len(entries)

    try:
        torch._dynamo.reset()
        options = {"guard_filter_fn": record}
        compiled = torch.compile(_whole, backend="eager", fullgraph=True, options=options)
        compiled(_Probed(), torch.randn(2, 3))
    finally:
        del sys.modules[_PROBE_MODULE]
        torch._dynamo.reset()
    return seen


def test_guard_checked_attribute_names_the_instance_forward_guard(guard_names) -> None:
    """``GuardFilterEntry.orig_guard.create_fn.keywords['attr']``."""
    forward = [name for kind, name, attr in guard_names if attr == "forward"]
    assert forward, f"no guard with create_fn.keywords attr='forward' in {guard_names}"
    kinds = {kind for kind, _, attr in guard_names if attr == "forward"}
    assert kinds == {"NOT_PRESENT_IN_GENERIC_DICT"}


def test_guard_submodule_path_reads_dynamos_submodule_names(guard_names) -> None:
    """Guard source names spell submodules ``module._modules['<name>']``."""
    paths = {cache_entries.guard_submodule_path(name) for _, name, attr in guard_names if attr}
    assert "linear" in paths, guard_names
    assert cache_entries.guard_submodule_path("module") == ""
    assert cache_entries.guard_submodule_path("module._modules['a'].config") is None
    assert cache_entries.guard_submodule_path("G['x']") is None


def test_guard_imported_modules_reads_dynamos_import_aliases(guard_names) -> None:
    """Guard source names reach modules through ``G['__import_<a>_dot_<b>']``."""
    modules = {m for _, name, _ in guard_names for m in cache_entries.guard_imported_modules(name)}
    assert _PROBE_MODULE in modules, guard_names
    assert "torch.nn.modules.module" in modules, guard_names


def test_guard_kinds_hold_each_entrys_guard_type(guard_names) -> None:
    """``GuardFilterEntry.guard_type`` and ``derived_guard_types``."""
    assert _KINDS and all(kind in kinds for kind, kinds in _KINDS)
    found = set().union(*(kinds for _, kinds in _KINDS))
    assert found & {"ID_MATCH", "CLASS_MATCH", "TYPE_MATCH"}, found


def test_kept_by_aot_compile_drops_globals_and_the_types_torch_cannot_save(guard_names) -> None:
    """``GuardFilterEntry.is_global`` and ``UNSUPPORTED_SERIALIZATION_GUARD_TYPES``."""
    kept = {(kind, name): k for kind, name, k, _ in _SAVING}
    assert not any(k for (_, name), k in kept.items() if name.startswith("G[")), kept
    assert kept[("CLOSURE_MATCH", "type(module.processor).__call__")] is False
    assert kept[("TYPE_MATCH", "module.processor")] is True


def test_unsavable_guard_reads_the_types_a_guard_derives(guard_names) -> None:
    """A ``CONSTANT_MATCH`` on the processor's code derives ``ID_MATCH``: torch's default keeps
    it and cannot save it (diffusers' ``PackageError``); a ``TYPE_MATCH`` is saved."""
    code = "dict(type(module.processor).__dict__)['__call__'].__code__"
    rows = {(kind, name): (k, u) for kind, name, k, u in _SAVING}
    assert rows[("CONSTANT_MATCH", code)] == (True, True), sorted(rows)
    assert rows[("TYPE_MATCH", "module.processor")] == (True, False)


def test_guard_type_of_reads_dynamos_type_sources(guard_names) -> None:
    """Guard source names spell ``type(x)`` and a class's dict ``dict(type(x).__dict__)``."""
    found = {cache_entries.guard_type_of(name) for _, name, _, _ in _SAVING}
    assert ("", "processor") in found and ("", None) in found, found
    assert cache_entries.guard_type_of("type(module._modules['a']._modules['b'])") == ("a.b", None)
    assert cache_entries.guard_type_of("module.processor") is None
    assert cache_entries.guard_type_of("type(G['x'])") is None


def test_covered_calls_reads_each_entrys_tensor_guards() -> None:
    import torch

    from torchkiln._internals.cache_entries import dynamo_guard_table

    def function(*args: Any, **kwargs: Any) -> Any:
        return args[0] * 2 + kwargs["bias"]

    compiled = torch.compile(function, backend="eager")
    compiled(torch.ones(2, 3), bias=torch.ones(3))
    compiled(torch.ones(4, 3), bias=torch.ones(3))  # a second entry, its first dim dynamic
    families = dynamo_guard_table(function.__code__, lambda code: code).covered_calls()
    assert sorted(families) == [
        "args[0] float32[*, 3], kwargs['bias'] float32[3]",
        "args[0] float32[2, 3], kwargs['bias'] float32[3]",
    ]
