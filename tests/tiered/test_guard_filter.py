"""The guard filter of whole-model artifacts: what it drops, what it keeps, what it records."""

from __future__ import annotations

import functools
import types

from torchkiln.artifacts.whole_guards import GuardFilter, module_path


def entry(guard_type, name, derived=(), attr=None):
    create_fn = functools.partial(lambda **_: None, attr=attr) if attr else None
    return types.SimpleNamespace(
        guard_type=guard_type,
        name=name,
        derived_guard_types=derived,
        orig_guard=types.SimpleNamespace(create_fn=create_fn),
    )


def test_module_path_reads_chains_of_submodules_only():
    assert module_path("module._modules['model']._modules['layers']._modules['0']") == (
        "model.layers.0"
    )
    assert module_path("module") == ""
    assert module_path("module._modules['model'].config") is None
    assert module_path("G['x']") is None


def test_identity_guards_are_dropped_and_their_modules_recorded():
    guard_filter = GuardFilter(["model.layers.0"])
    keep = guard_filter(
        [
            entry("MODULE_MATCH", "G['__import_transformers_dot_masking_utils']"),
            entry("CONSTANT_MATCH", "f.__code__", derived=("ID_MATCH",)),
            entry("TENSOR_MATCH", "L['args'][0]"),
            entry("NOT_PRESENT_IN_GENERIC_DICT", "module._modules['model']._modules['layers']._modules['0']", attr="forward"),
            entry("NOT_PRESENT_IN_GENERIC_DICT", "module._modules['model']", attr="forward"),
            entry("NOT_PRESENT_IN_GENERIC_DICT", "module._modules['model']._modules['layers']._modules['0']", attr="gradient_checkpointing"),
        ]
    )  # fmt: skip
    # Kept: tensor metadata, and instance-forward guards on modules that are not regions.
    assert keep == [False, False, True, False, True, True]
    assert guard_filter.modules == {"transformers.masking_utils"}
    assert guard_filter.dropped == {"MODULE_MATCH": 1, "CONSTANT_MATCH": 1, "region forward": 1}


def test_guards_on_the_position_of_transformers_output_registry_keys_are_dropped():
    # Their positions depend on which model classes the process built first (a new process
    # that built only this model failed every call on such a guard).
    registry = "G['__import_transformers_dot_utils_dot_output_capturing']._CAN_RECORD_REGISTRY"
    guard_filter = GuardFilter([])
    keep = guard_filter(
        [
            entry("EQUALS_MATCH", f"list(dict.keys({registry}))[2]"),
            entry("DICT_LENGTH", registry),
            entry("EQUALS_MATCH", "L['kwargs']['use_cache']"),
        ]
    )
    assert keep == [False, False, True]
    assert guard_filter.dropped == {"transformers output registry": 2}
