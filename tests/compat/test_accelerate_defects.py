"""Where Accelerate's behaviour is a defect, torchkiln's drop-ins behave correctly.

Each test shows torchkiln's behaviour; ``test_accelerate_reference.py`` shows Accelerate's on
the same case when Accelerate is installed.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from accelerate_helpers import compiled_graphs, gpt2_model, llama_model, logits, token_ids
from torch import nn

import torchkiln
from torchkiln.compat.accelerate import (
    compile_regions,
    compile_regions_fsdp2,
    extract_model_from_parallel,
    has_compiled_regions,
)
from torchkiln.examples import toy

GPT2_REGIONS = [
    "transformer.h.0",
    "transformer.h.1",
    "transformer.wte",
    "transformer.wpe",
    "transformer.ln_f",
    "lm_head",
]


def wrap_in_autocast(model: nn.Module) -> None:
    """What a user (or an older Accelerate) does: wrap the *bound* forward in autocast."""
    model.forward = torch.autocast("cpu", dtype=torch.bfloat16)(model.forward)


def wrap_like_prepare(model: nn.Module) -> None:
    """What ``Accelerator.prepare`` does under mixed precision (minus the fp32 conversion)."""
    model._original_forward = model.forward
    model.forward = types.MethodType(
        torch.autocast("cpu", dtype=torch.bfloat16)(model.forward.__func__), model
    )


@pytest.mark.parametrize("wrap", [wrap_in_autocast, wrap_like_prepare])
def test_regions_compile_under_a_mixed_precision_forward(wrap) -> None:
    model = gpt2_model()
    wrap(model)
    compiled = compile_regions(model, backend="eager")
    out = logits(compiled, token_ids())
    assert out.dtype == torch.bfloat16  # the wrapper still runs ...
    assert compiled_graphs() == 5  # ... and so do the compiled regions: one block graph + 4 leaves
    statuses = {r["path"]: r["status"] for r in torchkiln.report(compiled).to_dict()["regions"]}
    assert list(statuses) == GPT2_REGIONS
    assert all(status.startswith("compiled") for status in statuses.values())


def test_checkpoints_have_plain_keys_and_load_into_an_eager_model(tmp_path: Path) -> None:
    model = compile_regions(llama_model(), backend="eager")
    logits(model, token_ids())
    path = tmp_path / "checkpoint.pt"
    torch.save(model.state_dict(), path)

    fresh = llama_model()
    with torch.no_grad():
        for parameter in fresh.parameters():
            parameter.zero_()
    result = fresh.load_state_dict(torch.load(path), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    assert not any("_orig_mod" in key for key in torch.load(path))
    torch.testing.assert_close(logits(fresh, token_ids()), logits(model, token_ids()))


def test_unwrap_without_fp32_wrapper_leaves_the_prepared_model_alone() -> None:
    model = gpt2_model()
    wrap_like_prepare(model)
    compile_regions(model, backend="eager")
    forward_before = model.__dict__["forward"]
    ids = token_ids()

    plain = extract_model_from_parallel(model, keep_fp32_wrapper=False)

    assert plain is not model
    assert logits(plain, ids).dtype == torch.float32  # the copy has no autocast ...
    assert has_compiled_regions(plain)  # ... but keeps the compiled regions (shared children)
    assert plain.transformer is model.transformer
    # The prepared model still trains in mixed precision.
    assert model.__dict__["forward"] is forward_before
    assert "_original_forward" in model.__dict__
    assert logits(model, ids).dtype == torch.bfloat16


def test_unwrap_without_compile_or_fp32_wrapper() -> None:
    """The autocast wrapper comes off a copy of the root; its children stay the compiled
    model's, so the copy runs the compiled blocks in float32 and the prepared model keeps
    its wrapper."""
    model = gpt2_model()
    wrap_like_prepare(model)
    compile_regions(model, backend="eager")
    logits(model, token_ids())
    graphs = compiled_graphs()

    plain = extract_model_from_parallel(model, keep_fp32_wrapper=False, keep_torch_compile=False)

    assert logits(plain, token_ids()).dtype == torch.float32
    assert plain.transformer is model.transformer  # the compiled blocks (float32: recompiled)
    assert compiled_graphs() > graphs
    assert logits(model, token_ids()).dtype == torch.bfloat16


@pytest.mark.parametrize("wrap", [wrap_like_prepare, wrap_in_autocast], ids=["method", "closure"])
def test_unwrap_without_compile_keeps_the_fp32_wrapper_on_the_model_itself(wrap) -> None:
    model = gpt2_model()
    wrap(model)
    compile_regions(model, backend="eager")
    plain = extract_model_from_parallel(model, keep_torch_compile=False)
    assert plain is model  # keep_fp32_wrapper=True: nothing to take off, nothing copied
    assert logits(plain, token_ids()).dtype == torch.bfloat16


def test_nn_builtin_blocks_really_compile_in_the_fsdp2_variant() -> None:
    """``Module.compile()`` on ``nn.TransformerEncoderLayer`` / ``nn.Linear`` compiles nothing
    in torch 2.13; torchkiln's in-place compile does compile them."""
    model = toy(depth=2)
    ids = torch.randint(0, 512, (2, 8))
    eager = model(ids)
    compile_regions_fsdp2(model, backend="eager")
    torch.testing.assert_close(model(ids), eager)
    assert compiled_graphs() == 4  # the block class once, embed, norm, head
    assert [type(layer) for layer in model.layers] == [nn.TransformerEncoderLayer] * 2


# --- DDP, in one process -------------------------------------------------------------------


@pytest.fixture
def process_group(tmp_path: Path) -> Iterator[None]:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_compile_regions_on_a_ddp_model_compiles_the_module_inside(process_group: None) -> None:
    model = llama_model()
    ddp = nn.parallel.DistributedDataParallel(model)
    ids = token_ids()
    eager = logits(model, ids)
    returned = compile_regions(ddp, backend="eager")
    assert returned is ddp and ddp.module is model and ddp._orig_mod is ddp
    torch.testing.assert_close(logits(ddp, ids), eager)
    assert compiled_graphs() == 4
    assert extract_model_from_parallel(ddp) is model


def test_unwrap_of_torch_compile_around_ddp_keeps_the_ddp(process_group: None) -> None:
    model = llama_model()
    ddp = nn.parallel.DistributedDataParallel(model)
    prepared = torch.compile(ddp, backend="eager")

    unwrapped = extract_model_from_parallel(prepared, keep_torch_compile=True)

    assert prepared._orig_mod is ddp  # the prepared model still syncs gradients
    assert isinstance(unwrapped, torch._dynamo.eval_frame.OptimizedModule)
    assert unwrapped._orig_mod is model and unwrapped is not prepared
    torch.testing.assert_close(logits(unwrapped, token_ids()), logits(model, token_ids()))
    assert extract_model_from_parallel(prepared, keep_torch_compile=False) is model
