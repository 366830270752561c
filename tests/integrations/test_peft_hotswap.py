"""PEFT LoRA adapters on a regionally compiled default-config Llama: hot-swapping adapter B in
for A compiles nothing new and gives eager's outputs with B; adapters outside the repeated
blocks are named by an ``AdapterPlacementWarning``."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

import torchkiln
from torchkiln.engine.adapter_placement import AdapterPlacementWarning
from torchkiln.examples import example_inputs, llama

peft = pytest.importorskip("peft")
hotswap = pytest.importorskip("peft.utils.hotswap")


@pytest.fixture(autouse=True)
def fresh_dynamo(reset_dynamo: None) -> None:
    """Graph counts are this test's own."""


def base() -> torch.nn.Module:
    torch.manual_seed(0)  # the same base weights every time
    return llama(depth=2, hidden_size=64, heads=4, kv_heads=2, intermediate_size=128,
                 vocab_size=256).eval()  # fmt: skip


def save_adapter(directory: Path, seed: int, targets: list[str]) -> str:
    model = base()
    torch.manual_seed(seed)  # the adapter's own random (non-zero) weights
    config = peft.LoraConfig(r=4, target_modules=targets, init_lora_weights=False)
    peft.get_peft_model(model, config).save_pretrained(str(directory / str(seed)))
    return str(directory / str(seed))


def test_hotswapping_an_adapter_compiles_nothing_and_matches_eager(tmp_path: Path) -> None:
    targets = ["q_proj", "v_proj"]
    first, second = save_adapter(tmp_path, 1, targets), save_adapter(tmp_path, 2, targets)
    ids = example_inputs(base(), batch=1, seq=8)
    with torch.no_grad():
        expected = peft.PeftModel.from_pretrained(base(), second).eval()(ids).logits
        before = peft.PeftModel.from_pretrained(base(), first).eval()(ids).logits

    model = peft.PeftModel.from_pretrained(base(), first).eval()
    hotswap.prepare_model_for_compiled_hotswap(model, target_rank=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AdapterPlacementWarning)  # all inside the blocks
        torchkiln.compile(model, backend="aot_eager", progress="off")
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, before, rtol=1e-5, atol=1e-5)
    graphs = counters["stats"]["unique_graphs"]
    report = torchkiln.report(model)
    assert [r.graphs for r in report.regions if ".layers." in r.path] == [1, 0]  # one for both

    hotswap.hotswap_adapter(model, second, adapter_name="default")
    with torch.no_grad():
        swapped = model(ids).logits
    assert counters["stats"]["unique_graphs"] == graphs  # no new graph for adapter B
    torch.testing.assert_close(swapped, expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(swapped, before)


def test_an_adapter_on_lm_head_is_named_with_where_it_runs(tmp_path: Path) -> None:
    adapter = save_adapter(tmp_path, 1, ["q_proj", "lm_head"])
    model = peft.PeftModel.from_pretrained(base(), adapter).eval()
    with pytest.warns(AdapterPlacementWarning) as caught:
        torchkiln.compile(model, backend="eager", progress="off")
    message = str(caught[0].message)
    assert message.startswith("LoRA adapter layers outside the repeated blocks: ")
    assert "base_model.model.lm_head (" in message and "q_proj" not in message
    assert caught[0].filename == __file__
    # The report says it too, with where each runs.
    [note] = torchkiln.report(model).notes
    assert message.startswith(note) and "base_model.model.lm_head (eager)" in note
    assert f"note: {note}" in str(torchkiln.report(model))


def test_under_rest_leaves_an_lm_head_adapter_is_named_compiled_in_its_parts(
    tmp_path: Path,
) -> None:
    """Issue 41: under ``regions.rest=leaves`` the warning said ``lm_head (eager)`` although its
    base layer and adapter weights each ran compiled (the profiler's witness below)."""
    from profiler_witness import profiled_block_calls

    adapter = save_adapter(tmp_path, 1, ["q_proj", "lm_head"])
    model = peft.PeftModel.from_pretrained(base(), adapter).eval()
    with pytest.warns(AdapterPlacementWarning) as caught:
        torchkiln.compile(model, backend="eager", regions={"rest": "leaves"}, progress="off")
    head = model.base_model.model.lm_head
    parts = [head.base_layer, head.lora_A["default"], head.lora_B["default"]]
    ids = example_inputs(base(), batch=1, seq=8)
    with torch.no_grad():
        model(ids)  # the first calls compile
        seen = profiled_block_calls(parts, lambda: model(ids))
    assert [(s.calls, s.compiled) for s in seen] == [(1, 1)] * 3
    expected = (
        "base_model.model.lm_head (compiled in leaf regions: base_layer, lora_A.default, "
        "lora_B.default; eager: the LoRA forward that joins them)"
    )
    assert expected in str(caught[0].message) and "(eager)" not in str(caught[0].message)
    [note] = torchkiln.report(model).notes
    assert note.endswith(expected)


@pytest.mark.parametrize("targets", [["q_proj", "v_proj"], ["embed_tokens", "q_proj", "v_proj"]])
def test_under_rest_leaves_every_region_runs_and_none_stays_pending(targets: list[str]) -> None:
    """Issue 41: PEFT's ``lora_embedding_A``/``_B`` (``nn.ParameterDict``, no forward) were leaf
    regions that never ran, ``pending`` in the report for ever. The witness: a hook on every
    region's module counts its calls, outside torchkiln."""
    model = peft.get_peft_model(base(), peft.LoraConfig(r=4, target_modules=targets)).eval()
    torchkiln.compile(model, backend="eager", regions={"rest": "leaves"}, progress="off")
    report = torchkiln.report(model)
    calls = dict.fromkeys((r.path for r in report.regions), 0)
    for path in calls:
        model.get_submodule(path).register_forward_pre_hook(
            lambda module, args, path=path: calls.__setitem__(path, calls[path] + 1)
        )
    with torch.no_grad():
        model(example_inputs(base(), batch=1, seq=8))
    report = torchkiln.report(model)
    assert [p for p, n in calls.items() if n == 0] == []  # every region was called
    assert [r.path for r in report.regions if r.status != "compiled"] == []
    assert "not called yet" not in str(report)
    eager = dict(report.eager)
    if "embed_tokens" in targets:
        embedding = "base_model.model.model.embed_tokens"
        assert eager[f"{embedding}.lora_embedding_A"] == (
            f"no forward of its own: never called, its parameters are read by the forward of "
            f"{embedding}"
        )
        [note] = report.notes
        assert note.endswith(
            f"{embedding} (compiled in leaf regions: base_layer; eager: the LoRA forward that "
            "joins them, lora_embedding_A, lora_embedding_B)"
        )
