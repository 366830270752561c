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


def test_a_cache_in_another_layout_is_made_contiguous_in_place_with_its_values():
    # Inductor's compiled prefill leaves the cache in its own layout (the key projection's,
    # transposed); the decode entry was compiled for the contiguous layout torch.cat leaves
    # (inductor's depth-32 generate missed every decode step on "stride mismatch at index 2"
    # before this).
    import torch
    from transformers import DynamicCache

    from torchkiln.artifacts.whole_build import contiguous_state

    cache = DynamicCache()
    keys = torch.randn(1, 5, 4, 8).transpose(1, 2)  # [batch, heads, seq, dim], not contiguous
    cache.update(keys, keys.clone(), 0)
    cache.layers[0].keys, cache.layers[0].values = keys, keys.clone()  # as inductor left them
    ids = torch.arange(6).view(2, 3).t()  # a non-contiguous argument: left as it is
    assert not cache.layers[0].keys.is_contiguous()
    assert contiguous_state(((ids,), {"past_key_values": cache})) == 2  # keys and values
    assert cache.layers[0].keys.is_contiguous() and torch.equal(cache.layers[0].keys, keys)
    assert not ids.is_contiguous()
    assert contiguous_state(((ids,), {"past_key_values": cache})) == 0


def test_a_users_own_object_keeps_its_tensors_and_their_aliasing():
    """Only transformers' dynamic cache layers (which replace their tensors at every update)
    are made contiguous: a view the user's object holds stays that very view."""
    import types

    import torch

    from torchkiln.artifacts.whole_build import contiguous_state

    base = torch.randn(4, 6)
    holder = types.SimpleNamespace(view=base.t(), nested=types.SimpleNamespace(view=base.t()))
    view, nested = holder.view, holder.nested.view
    assert contiguous_state(((), {"state": holder, "more": [holder.nested]})) == 0
    assert holder.view is view and holder.nested.view is nested
    base.add_(1)  # still a view of the user's tensor
    assert torch.equal(holder.view, base.t())
