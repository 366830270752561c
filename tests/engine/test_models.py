"""The model matrix: real transformers models (Llama, GPT-2, BERT, T5, Qwen2-MoE) and toys with
blocks in ``nn.Sequential``, ``nn.ModuleDict``, nested lists, two block types and built-in
``nn.TransformerEncoderLayer`` blocks. For each: compiled in place, it computes what eager
computes, keeps its state dict and checkpoints, reports compiled frames for every region, keeps
its hooks, runs compiled under autocast, and decompiles back to the original."""

from __future__ import annotations

import copy
import io
import json
from collections import defaultdict
from typing import Any

import torch
from engine_zoo import CountingBackend, ModelCase, graphs_compiled, tensors
from torch import nn
from torch._dynamo.utils import counters

import torchkiln

FP32 = {"rtol": 1e-4, "atol": 1e-5}


def compile_eager(model: nn.Module, **options: Any) -> nn.Module:
    options.setdefault("backend", "eager")
    return torchkiln.compile(model, progress="off", **options)


def assert_outputs_equal(got: Any, want: Any, **tolerance: float) -> None:
    got_tensors, want_tensors = tensors(got), tensors(want)
    assert len(got_tensors) == len(want_tensors) > 0
    for index, (g, w) in enumerate(zip(got_tensors, want_tensors, strict=True)):
        torch.testing.assert_close(
            g, w, **(tolerance or FP32), msg=lambda m, i=index: f"output {i}: {m}"
        )


def loss_of(output: Any) -> torch.Tensor:
    return sum(
        t.float().sum() for t in tensors(output) if t.is_floating_point() and t.requires_grad
    )


def region_modules(model: nn.Module) -> list[nn.Module]:
    return [region.module for region in torchkiln.plan(model, backend="eager").regions()]


def test_plan_groups_the_blocks(case: ModelCase) -> None:
    plan = torchkiln.plan(case.build(), backend="eager")
    assert {g.name: len(g.regions) for g in plan.groups} == dict(case.groups)
    assert plan.selector == "repeated"


def test_outputs_and_gradients_match_eager(case: ModelCase) -> None:
    model = case.build()
    twin = copy.deepcopy(model)
    assert torchkiln.compile(model, backend=case.train_backend, progress="off") is model
    inputs = case.inputs()

    got, want = model(**inputs), twin(**inputs)
    assert_outputs_equal(got, want)
    assert graphs_compiled() == case.graphs

    loss_of(got).backward()
    loss_of(want).backward()
    compiled_params = dict(model.named_parameters())
    compared = 0
    for name, param in twin.named_parameters():
        grad = compiled_params[name].grad
        if param.grad is None:
            assert grad is None, f"{name} has a gradient only when compiled"
            continue
        assert grad is not None, f"{name} has no gradient when compiled"
        torch.testing.assert_close(
            grad, param.grad, **FP32, msg=lambda m, n=name: f"grad of {n}: {m}"
        )
        compared += 1
    assert compared >= len(list(twin.parameters())) // 2


def test_state_dict_identical_and_checkpoints_round_trip(case: ModelCase) -> None:
    model = case.build()
    twin = copy.deepcopy(model)
    compile_eager(model)
    inputs = case.inputs()
    model(**inputs)

    state, twin_state = model.state_dict(), twin.state_dict()
    assert list(state) == list(twin_state)
    assert not any("_orig_mod" in key or "torchkiln" in key for key in state)
    for key, value in twin_state.items():
        assert torch.equal(state[key], value), key

    # compiled -> eager: change the compiled model's weights, save, load strictly into a fresh one.
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.01)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    eager = case.build()
    eager.load_state_dict(torch.load(buffer, weights_only=True), strict=True)
    for key, value in model.state_dict().items():
        assert torch.equal(eager.state_dict()[key], value), key
    assert_outputs_equal(model(**inputs), eager(**inputs))

    # eager -> compiled: the compiled code runs with the loaded weights, without recompiling.
    with torch.no_grad():
        for param in eager.parameters():
            param.mul_(0.9)
    buffer = io.BytesIO()
    torch.save(eager.state_dict(), buffer)
    buffer.seek(0)
    graphs_before = graphs_compiled()
    model.load_state_dict(torch.load(buffer, weights_only=True), strict=True)
    assert_outputs_equal(model(**inputs), eager(**inputs))
    assert graphs_compiled() == graphs_before
    assert torchkiln.is_compiled(model)


def test_report_shows_compiled_frames_for_every_region(case: ModelCase) -> None:
    model = case.build()
    plan = torchkiln.plan(model, backend="eager")
    compile_eager(model)
    model(**case.inputs())

    report = torchkiln.report(model)
    assert [r.path for r in report.regions] == [r.path for r in plan.regions()]
    assert report.total_graphs == graphs_compiled() == case.graphs
    by_group: dict[str, list[Any]] = defaultdict(list)
    for region in report.regions:
        assert region.status == "compiled", region
        assert region.fallback_reason is None
        assert not region.recompile_limit_hit
        by_group[region.group].append(region)
    for regions in by_group.values():
        first, *others = regions
        assert first.graphs >= 1 and not first.reused and first.compile_seconds > 0
        if case.name != "t5":
            assert all(r.reused and r.graphs == 0 for r in others)
    if case.name == "t5":
        # The decoder's shorter sequence recompiles the shared T5LayerFF once: see
        # ModelCase("t5").
        assert [r.graphs for r in report.regions] == [1, 1, 1, 0, 1, 0]
        assert [r.reused for r in report.regions] == [False, False, False, True, False, True]
        assert [r.recompiles for r in report.regions] == [0, 1, 0, 0, 0, 0]
    text = str(report)  # reused regions are folded into one line: first .. last
    assert report.regions[0].path in text and report.regions[-1].path in text
    json.dumps(report.to_dict())


def test_hooks_registered_before_and_after_compiling_fire(case: ModelCase) -> None:
    model = case.build()
    first, *_, last = region_modules(model)
    calls: list[tuple[str, nn.Module]] = []

    def pre_hook(module: nn.Module, args: Any) -> None:
        calls.append(("pre", module))

    def hook(module: nn.Module, args: Any, output: Any) -> None:
        assert tensors(output)
        calls.append(("post", module))

    first.register_forward_pre_hook(pre_hook)
    first.register_forward_hook(hook)
    last.register_forward_hook(hook)
    counting = CountingBackend()
    pm = torchkiln.PluginManager(entry_points=False, env={})
    pm.register(counting, name="counting")
    torchkiln.compile(model, backend="counting", plugins=pm, progress="off")
    last.register_forward_pre_hook(pre_hook)

    model(**case.inputs())
    assert calls == [("pre", first), ("post", first), ("pre", last), ("post", last)]
    assert len(counting.runs) == sum(case.groups.values())  # every region ran compiled code


def test_compiled_regions_run_under_autocast(case: ModelCase) -> None:
    model = case.build()
    twin = copy.deepcopy(model)
    counting = CountingBackend()
    pm = torchkiln.PluginManager(entry_points=False, env={})
    pm.register(counting, name="counting")
    torchkiln.compile(model, backend="counting", plugins=pm, progress="off")
    inputs = case.inputs()

    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = model(**inputs)
        want = twin(**inputs)
    regions = sum(case.groups.values())
    assert len(counting.runs) == regions
    assert all(run.autocast for run in counting.runs)
    assert counting.compiled == case.graphs
    assert_outputs_equal(got, want, rtol=2e-2, atol=2e-2)

    # A second call under autocast runs the same graphs again, with no new compile.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(**inputs)
    assert len(counting.runs) == 2 * regions and counting.compiled == case.graphs


def test_decompile_restores_the_original(case: ModelCase) -> None:
    model = case.build()
    twin = copy.deepcopy(model)
    compile_eager(model)
    inputs = case.inputs()
    model(**inputs)

    assert torchkiln.decompile(model) is model
    assert not torchkiln.is_compiled(model)
    for (name, module), (twin_name, twin_module) in zip(
        model.named_modules(), twin.named_modules(), strict=True
    ):
        assert name == twin_name and type(module) is type(twin_module)
        assert "forward" not in module.__dict__, name
        assert list(module.__dict__) == list(twin_module.__dict__), name
    assert not any("torchkiln" in key for key in model.__dict__)

    frames, graphs = counters["frames"]["total"], graphs_compiled()
    assert_outputs_equal(model(**inputs), twin(**inputs))
    assert counters["frames"]["total"] == frames and graphs_compiled() == graphs  # no Dynamo

    saved, saved_twin = io.BytesIO(), io.BytesIO()
    torch.save(model, saved)
    torch.save(twin, saved_twin)
    assert len(saved.getvalue()) == len(saved_twin.getvalue())
    saved.seek(0)
    loaded = torch.load(saved, weights_only=False)
    assert type(loaded) is type(model)
    assert_outputs_equal(loaded(**inputs), twin(**inputs))
