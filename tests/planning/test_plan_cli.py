"""``torchkiln plan`` shows the level chosen and why."""

from __future__ import annotations

import warnings

import pytest

from torchkiln.cli.commands import main

pytest.importorskip("transformers")


def test_plan_command_names_the_level_and_why(capsys: pytest.CaptureFixture[str]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["plan", "plan_zoo:resnet50_layout"]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith("ResNetModel  [auto: repeated blocks found: 2x ResNetBottleNeckLayer,")
    assert "level: ResNetBottleNeckLayer (4 shapes), the largest modules that repeat" in first
    assert "not ResNetStage: its 4 instances all differ (submodules of layers)" in first
    assert "the model's hint ResNetConvLayer: 49 instances in 20 shapes" in first
    assert "12 regions in 4 groups: 4 compile units expected" in out
    assert (
        "  0: ResNetBottleNeckLayer  (eager: a shape of its own, not repeated (unlike group "
        "ResNetBottleNeckLayer: submodules of shortcut); outside the selected regions"
    ) in out
    assert "  1: ResNetBottleNeckLayer  <- compiled (group ResNetBottleNeckLayer)" in out
