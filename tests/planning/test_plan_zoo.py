"""Plans over 32 transformers architectures (decoders, encoders, encoder-decoders, vision
transformers, convnets, audio), built tiny from their default configs.

Fast tests check the plan level on every model and compile the ResNet-50 layout; the slow ones
compile every model with ``backend="eager"`` (graph counting needs no real compiler) and
compare graph counts with a full ``torch.compile`` of the same model, from Dynamo's counters.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Iterator

import pytest
import torch
from plan_zoo import CASES, ZooCase
from torch import nn
from torch._dynamo.utils import counters

import torchkiln
from torchkiln.plugin import RegionPlan, StructureIndex

pytest.importorskip("transformers")

FAMILIES = Counter(case.family for case in CASES)


@pytest.fixture(autouse=True)
def quiet_transformers() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def graphs() -> int:
    return int(counters["stats"]["unique_graphs"])


def block_shapes(model: nn.Module, case: ZooCase) -> int:
    """Distinct structural shapes among the model's blocks (its layer classes)."""
    index = StructureIndex()
    blocks = [m for m in model.modules() if type(m).__name__ in case.blocks]
    assert blocks, f"{case.name}: no module of {sorted(case.blocks)}"
    return len({index.key(m) for m in blocks})


def check_groups_are_shapes(plan: RegionPlan) -> None:
    """Every group: 2+ structurally identical regions; two groups never share a shape."""
    index = StructureIndex()
    keys = []
    for group in plan.groups:
        assert len(group.regions) >= 2, f"{group.name} is a singleton region"
        shapes = {index.key(region.module) for region in group.regions}
        assert len(shapes) == 1, f"{group.name} mixes {len(shapes)} shapes"
        keys.append(shapes.pop())
    assert len(keys) == len(set(keys))


def test_the_zoo_covers_every_family() -> None:
    assert len(CASES) >= 30
    assert set(FAMILIES) == {"decoder", "encoder", "encoder-decoder", "vision", "convnet", "audio"}


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_plan_level(case: ZooCase) -> None:
    model = case.build()
    plan = torchkiln.plan(model, backend="eager")
    if not case.level:
        assert plan.selector == "whole" and plan.requested == "auto"
        assert "no repeated blocks found" in plan.reason
        return
    assert plan.selector == "repeated"
    assert {g.module_class.__name__ for g in plan.groups} == case.level, plan.reason
    check_groups_are_shapes(plan)
    levels = ", ".join(dict.fromkeys(g.module_class.__name__ for g in plan.groups))
    assert f"level: {levels}" in plan.reason


def test_singletons_the_model_names_join_the_rest() -> None:
    bert = next(case for case in CASES if case.name == "bert")
    plan = torchkiln.plan(bert.build(), backend="eager")
    assert [g.name for g in plan.groups] == ["BertLayer"]
    assert ("embeddings", "outside the selected regions (regions.rest=eager)") in [
        (part.path, part.reason) for part in plan.eager
    ]
    assert "the model's hint BertEmbeddings occurs once, so it is not a block" in plan.reason


def test_swin_says_why_its_stages_and_layers_are_not_the_level() -> None:
    swin = next(case for case in CASES if case.name == "swin")
    plan = torchkiln.plan(swin.build(), backend="eager")
    assert "not SwinStage: its 4 instances all differ" in plan.reason
    assert "not SwinLayer: its 12 instances all differ (int attribute shift_size)" in plan.reason


def test_resnet50_layout_compiles_bottlenecks_grouped_by_shape() -> None:
    """``ResNetConfig()``'s layout (3, 4, 6, 3 bottlenecks), narrow: the model names its 49
    conv layers as blocks; the plan groups the bottlenecks by shape instead."""
    resnet = next(case for case in CASES if case.name == "resnet")
    model = resnet.build()
    assert [len(stage.layers) for stage in model.encoder.stages] == [3, 4, 6, 3]
    assert block_shapes(model, resnet) == 8  # each stage: its first bottleneck, the others
    plan = torchkiln.plan(model, backend="eager")
    assert [(g.name, len(g.regions)) for g in plan.groups] == [
        ("ResNetBottleNeckLayer", 2),
        ("ResNetBottleNeckLayer_2", 3),
        ("ResNetBottleNeckLayer_3", 5),
        ("ResNetBottleNeckLayer_4", 2),
    ]
    assert "level: ResNetBottleNeckLayer (4 shapes), the largest modules that repeat" in (
        plan.reason
    )
    assert "the model's hint ResNetConvLayer: 49 instances in 20 shapes" in plan.reason
    inputs = resnet.inputs(model)
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
        torchkiln.compile(model, backend="eager", progress="off")
        torch.testing.assert_close(model(**inputs).last_hidden_state, expected)
        model(**inputs)
    report = torchkiln.report(model)
    assert [r.status for r in report.regions] == ["compiled"] * 12
    assert not any(r.recompile_limit_hit for r in report.regions)
    assert graphs() == report.total_graphs == 4  # <= 8 shapes + 1


def first_tensor(output: object) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    return next(v for v in output.values() if isinstance(v, torch.Tensor))  # type: ignore[attr-defined]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_graphs_per_model(case: ZooCase) -> None:
    """At most the distinct block shapes + 1 graphs, no region eager, each group within one
    recompile of a full compile's graph count (a new input shape at one of its call sites:
    Dynamo's automatic dynamic shapes recompile once), the eager outputs."""
    model = case.build()
    inputs = case.inputs(model)
    with torch.no_grad():
        expected = first_tensor(model(**inputs))
        full = torch.compile(model, backend="eager")
        full(**inputs)
        full_graphs = graphs()
        torch._dynamo.reset()
        counters.clear()

        torchkiln.compile(model, backend="eager", progress="off")
        torch.testing.assert_close(first_tensor(model(**inputs)), expected)
        model(**inputs)
    report = torchkiln.report(model)
    eager = [(r.path, r.fallback_reason) for r in report.regions if r.status != "compiled"]
    assert eager == []
    assert not any(r.recompile_limit_hit for r in report.regions)
    assert graphs() == report.total_graphs
    assert graphs() <= block_shapes(model, case) + 1
    per_group = Counter[str]()
    for region in report.regions:
        per_group[region.group] += region.graphs
    assert max(per_group.values(), default=0) <= full_graphs + 1, per_group
