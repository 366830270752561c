"""Contracts of ``torchkiln._internals.accelerate``: the attribute names Accelerate itself
writes and reads, checked against the installed Accelerate (and this torch)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from torch import nn

from torchkiln._internals import accelerate

pytest.importorskip("accelerate")


@pytest.fixture
def fresh_accelerate(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Accelerate's one process-wide state, reset around the test; no ACCELERATE_* setting."""
    from accelerate.state import AcceleratorState

    for name in [n for n in __import__("os").environ if n.startswith("ACCELERATE_")]:
        monkeypatch.delenv(name)
    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def test_set_orig_mod() -> None:
    """What Accelerate's ``extract_model_from_parallel`` unwraps a regional compile by."""
    import torch
    from accelerate.utils import extract_model_from_parallel

    model = nn.Sequential(torch.compile(nn.Linear(2, 2), backend="eager"))  # compiled regions
    plain = nn.Sequential(nn.Linear(2, 2))
    accelerate.set_orig_mod(model, plain)
    assert dict(model.named_children()).keys() == {"0"}  # not a submodule
    assert not any(key.startswith("_orig_mod") for key in model.state_dict())
    assert extract_model_from_parallel(model, keep_torch_compile=False) is plain


def test_has_orig_mod() -> None:
    from accelerate.utils import compile_regions

    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    assert not accelerate.has_orig_mod(model)
    assert accelerate.has_orig_mod(compile_regions(model, backend="eager"))  # as Accelerate sets it


def test_drop_orig_mod() -> None:
    model = nn.Linear(2, 2)
    accelerate.set_orig_mod(model, model)
    accelerate.drop_orig_mod(model)
    assert not accelerate.has_orig_mod(model)
    accelerate.drop_orig_mod(model)  # none: no change


def test_has_fp32_wrapper(fresh_accelerate: None) -> None:
    from accelerate import Accelerator

    model = nn.Linear(2, 2)
    assert not accelerate.has_fp32_wrapper(model)
    prepared = Accelerator(cpu=True, mixed_precision="bf16").prepare(model)
    assert accelerate.has_fp32_wrapper(prepared)  # Accelerate records what it wrapped there


def test_fp32_wrapped_forward(fresh_accelerate: None) -> None:
    from accelerate import Accelerator

    model = nn.Linear(2, 2)
    own = model.forward
    prepared = Accelerator(cpu=True, mixed_precision="bf16").prepare(model)
    assert accelerate.fp32_wrapped_forward(prepared, None) == own
    assert accelerate.fp32_wrapped_forward(nn.Linear(2, 2), "default") == "default"


def test_drop_fp32_wrapper_record(fresh_accelerate: None) -> None:
    from accelerate import Accelerator
    from accelerate.utils import extract_model_from_parallel

    prepared = Accelerator(cpu=True, mixed_precision="bf16").prepare(nn.Linear(2, 2))
    accelerate.drop_fp32_wrapper_record(prepared)
    assert not accelerate.has_fp32_wrapper(prepared)
    # Accelerate then finds no wrapper to take off: the forward stays as it is.
    forward = prepared.forward
    assert extract_model_from_parallel(prepared, keep_fp32_wrapper=False).forward == forward


def test_hook_of_recognises_add_hook_to_module_and_nothing_else() -> None:
    """``hook_of``, ``attached_hook`` and ``forward_under_hook`` against the hook Accelerate's
    ``add_hook_to_module`` attaches, and after ``remove_hook_from_module`` takes it off."""
    from accelerate.hooks import AlignDevicesHook, add_hook_to_module, remove_hook_from_module

    module = nn.Linear(2, 2)
    assert accelerate.hook_of(module) is None
    hook = AlignDevicesHook(execution_device="cpu")
    add_hook_to_module(module, hook)
    assert accelerate.hook_of(module) is hook
    assert accelerate.attached_hook(module) is hook
    under = accelerate.forward_under_hook(module)
    assert under.__func__ is nn.Linear.forward and under.__self__ is module
    # Without the wrapper as its forward, the hook is attached but not what a call runs.
    wrapper = module.__dict__.pop("forward")
    assert accelerate.hook_of(module) is None and accelerate.attached_hook(module) is hook
    module.__dict__["forward"] = wrapper
    remove_hook_from_module(module)
    assert accelerate.hook_of(module) is None and accelerate.attached_hook(module) is None
    assert accelerate.forward_under_hook(module) is None
    # Another partial as forward is not Accelerate's wrapper.
    import functools

    module.__dict__["forward"] = functools.partial(nn.Linear.forward, module)
    module.__dict__["_hf_hook"] = hook
    assert accelerate.hook_of(module) is None
