"""In-place mechanics: what ``forward`` becomes, copies, instance-level forwards, undo."""

from __future__ import annotations

import copy
import functools
import io
from pathlib import Path

import pytest
import torch
from engine_zoo import MlpBlock, NestedListModel, graphs_compiled, sequential_model, token_ids
from torch import nn
from torch._dynamo.utils import counters

import torchkiln
from torchkiln.engine.compile_state import STATE_ATTR
from torchkiln.engine.region_runtime import RegionRuntime


def compile_eager(model: nn.Module, **options: object) -> nn.Module:
    return torchkiln.compile(model, backend="eager", progress="off", **options)


def perturbed_copy(model: nn.Module) -> nn.Module:
    """A deep copy whose weights differ from ``model``'s."""
    clone = copy.deepcopy(model)
    with torch.no_grad():
        for param in clone.parameters():
            param.mul_(0.5)
    return clone


def plain_twin(model: nn.Module) -> nn.Module:
    """An uncompiled model with ``model``'s weights."""
    twin = NestedListModel()
    twin.load_state_dict(model.state_dict())
    return twin.eval()


def test_a_regions_forward_is_one_object_from_compile_to_decompile() -> None:
    """Nothing swaps a region's forward while calls run: first, later, another shape."""
    model = compile_eager(NestedListModel().eval())
    blocks = [model.stages[0][0], model.stages[1][0]]
    installed = [block.__dict__["forward"] for block in blocks]
    assert all(isinstance(forward, RegionRuntime) for forward in installed)

    for ids in (token_ids(), token_ids(), token_ids(batch=3, seq=5), token_ids()):
        model(ids)
        assert all(b.__dict__["forward"] is f for b, f in zip(blocks, installed, strict=True))
    # The same code for every region of the group: compiled once, reused.
    assert installed[0].run is installed[1].run is installed[0].code
    assert type(blocks[1]).forward is MlpBlock.forward
    torchkiln.decompile(model)
    assert not any("forward" in block.__dict__ for block in blocks)


def test_a_copy_made_before_the_first_call_runs_its_own_weights() -> None:
    model = compile_eager(NestedListModel().eval())
    clone = perturbed_copy(model)
    ids = token_ids()

    torch.testing.assert_close(clone(ids), plain_twin(clone)(ids))
    torch.testing.assert_close(model(ids), plain_twin(model)(ids))
    assert torchkiln.is_compiled(clone)
    assert all(r.status == "compiled" for r in torchkiln.report(clone).regions)
    assert all(r.status == "compiled" for r in torchkiln.report(model).regions)


def test_a_copy_made_after_the_first_call_runs_its_own_weights() -> None:
    model = compile_eager(NestedListModel().eval())
    ids = token_ids()
    model(ids)
    clone = perturbed_copy(model)

    torch.testing.assert_close(clone(ids), plain_twin(clone)(ids))
    assert graphs_compiled() == 1


def test_a_copy_of_a_compiled_model_decompiles() -> None:
    model = compile_eager(NestedListModel().eval())
    clone = copy.deepcopy(model)
    torchkiln.decompile(clone)

    assert not any("forward" in m.__dict__ for m in clone.modules())
    ids = token_ids()
    torch.testing.assert_close(clone(ids), plain_twin(clone)(ids))
    assert counters["frames"]["total"] == 0
    assert torchkiln.is_compiled(model)


def test_an_instance_forward_is_compiled_and_restored() -> None:
    """A forward set on the instance (Accelerate's autocast wrapper) is what gets compiled."""
    model = sequential_model().eval()
    twin = copy.deepcopy(model)
    wrapper = torch.autocast("cpu", dtype=torch.bfloat16)(model.forward)
    model.forward = wrapper
    compile_eager(model, regions="whole")
    x = torch.randn(2, 8, 32)

    out = model(x)
    assert out.dtype == torch.bfloat16  # autocast ran inside the compiled region
    assert graphs_compiled() == 1
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.testing.assert_close(out, twin(x), rtol=2e-2, atol=2e-2)
    torchkiln.decompile(model)
    assert model.__dict__["forward"] is wrapper


def test_compile_decompile_compile() -> None:
    model = NestedListModel().eval()
    ids = token_ids()
    expected = plain_twin(model)(ids)
    compile_eager(model)
    model(ids)
    torchkiln.decompile(model)
    torch._dynamo.reset()
    counters.clear()

    compile_eager(model)
    torch.testing.assert_close(model(ids), expected)
    assert graphs_compiled() == 1
    assert [r.status for r in torchkiln.report(model).regions] == ["compiled"] * 4


def test_decompile_leaves_no_dynamo_marks_on_parameters() -> None:
    """Dynamo tags the parameters it sees (``_dynamo_static_input_type``); decompile removes the
    tags it caused, so a whole-model pickle is byte for byte the original's."""
    model = NestedListModel().eval()
    twin = copy.deepcopy(model)
    compile_eager(model)
    model(token_ids())
    assert any(p.__dict__ for p in model.parameters())  # Dynamo did tag them

    torchkiln.decompile(model)
    assert [p.__dict__ for p in model.parameters()] == [p.__dict__ for p in twin.parameters()]
    saved, saved_twin = io.BytesIO(), io.BytesIO()
    torch.save(model, saved)
    torch.save(twin, saved_twin)
    assert saved.getvalue() == saved_twin.getvalue()


def test_decompile_keeps_marks_the_user_set() -> None:
    model = NestedListModel().eval()
    marked = model.stages[0][0].up.weight
    torch._dynamo.mark_static_address(marked, guard=False)
    compile_eager(model)
    model(token_ids())
    torchkiln.decompile(model)
    assert marked._dynamo_static_input_type == "unguarded"


def test_decompile_of_an_uncompiled_model_is_a_no_op() -> None:
    model = NestedListModel().eval()
    before = dict(model.__dict__)
    assert torchkiln.decompile(model) is model
    assert model.__dict__ == before


def test_state_lives_in_the_root_dict_not_in_modules_or_state_dict() -> None:
    model = compile_eager(NestedListModel().eval())
    assert STATE_ATTR in model.__dict__
    assert STATE_ATTR not in dict(model.named_modules())
    assert all(STATE_ATTR not in key for key in model.state_dict())
    with pytest.raises(AttributeError):
        model.stages[0][0]._torchkiln_compiled  # noqa: B018  (only the root holds the state)


def test_pickling_a_compiled_model_whole_saves_the_plain_model(tmp_path: Path) -> None:
    """torch.save opens (truncates) its file before pickling: a refusal there would destroy an
    existing checkpoint. The pickle holds the plain model instead, and loads as one."""
    model = compile_eager(NestedListModel().eval())
    expected = model(token_ids())
    path = tmp_path / "model.pt"
    torch.save(model.state_dict(), path)  # a good checkpoint already there
    torch.save(model, path)
    loaded = torch.load(path, weights_only=False)
    assert type(loaded) is NestedListModel
    assert not torchkiln.is_compiled(loaded)
    assert not any(
        "forward" in m.__dict__ or "_torchkiln_region" in m.__dict__ for m in loaded.modules()
    )
    torch.testing.assert_close(loaded(token_ids()), expected)
    assert torchkiln.is_compiled(model)  # the compiled model itself is untouched
    torch.testing.assert_close(model(token_ids()), expected)


def test_pickling_a_hierarchically_compiled_model_keeps_the_checkpoint(tmp_path: Path) -> None:
    """Issue 23 D1: the nested blocks' forwards (``functools.partial`` over torch's
    ``nested_compile_region`` function, a local object) used to fail to pickle after
    ``torch.save`` had truncated the file. The pickle holds the plain model."""
    from precompile_models import Block, inputs, stack

    model = stack(3).eval()
    expected = model(inputs())
    torchkiln.compile(model, backend="eager", regions="hierarchical", progress="off")
    assert isinstance(model.blocks[0].__dict__["forward"], functools.partial)  # nested, marked
    torch.testing.assert_close(model(inputs()), expected)
    path = tmp_path / "model.pt"
    torch.save(model.state_dict(), path)  # a good checkpoint already there
    torch.save(model, path)
    loaded = torch.load(path, weights_only=False)
    assert not torchkiln.is_compiled(loaded)
    blocks = [m for m in loaded.modules() if isinstance(m, Block)]
    assert len(blocks) == 3 and not any("forward" in b.__dict__ for b in blocks)
    # The root is the plan's one region, built after its state: its forward loads as the
    # class's own, bound (its state and region records as None).
    forward = loaded.__dict__.get("forward", loaded.forward)
    assert forward.__func__ is type(loaded).forward
    torch.testing.assert_close(loaded(inputs()), expected)
    torch.testing.assert_close(model(inputs()), expected)  # the compiled model is untouched


def test_pickling_before_the_first_call_saves_the_plain_model_too() -> None:
    model = compile_eager(NestedListModel().eval())
    saved = io.BytesIO()
    torch.save(model, saved)
    saved.seek(0)
    loaded = torch.load(saved, weights_only=False)
    assert not any("forward" in m.__dict__ for m in loaded.modules())
    torch.testing.assert_close(loaded(token_ids()), model(token_ids()))


def test_a_single_compiled_block_can_be_deep_copied() -> None:
    model = compile_eager(NestedListModel().eval())
    block = copy.deepcopy(model.stages[0][0])
    x = torch.randn(2, 3, 32)
    torch.testing.assert_close(block(x), model.stages[0][0](x))
