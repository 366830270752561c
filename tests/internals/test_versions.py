"""The tested torch range and version-gated features: one warning outside the range, and a
feature this torch lacks refused by name and release when the configuration is read."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import torchkiln
from torchkiln._internals import versions
from torchkiln.errors import ConfigError


@pytest.mark.parametrize(
    ("version", "inside"),
    [
        ("2.11.0+cu130", True),
        ("2.13.0+cpu", True),
        ("2.15.0", True),
        ("2.10.0", False),
        ("2.16.0.dev20261101", False),
        ("garbage", False),
    ],
)
def test_the_tested_range_is_2_11_to_2_15(version: str, inside: bool) -> None:
    message = versions.untested_release_message(version)
    assert (message is None) is inside
    if not inside:
        assert f"this is torch {version}" in message
        assert "tested on torch 2.11 to 2.15" in message


def test_a_torch_outside_the_range_gets_one_warning_naming_the_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(versions, "torch_release", lambda: "2.16.0")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        versions.warn_if_untested()
    assert [w.category for w in caught] == [versions.UntestedTorchWarning]
    assert "tested on torch 2.11 to 2.15; this is torch 2.16.0" in str(caught[0].message)


def test_the_installed_torch_imports_torchkiln_without_a_warning() -> None:
    code = "import warnings; warnings.simplefilter('error'); import torchkiln; print('ok')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_probes_agree_with_the_releases_the_docs_name() -> None:
    release = versions.release_tuple(torch.__version__)
    assert release is not None
    for feature in versions.FEATURES.values():
        since = versions.release_tuple(feature.since)
        assert since is not None
        assert (feature.missing() is None) is (release >= since), feature.name


def test_a_feature_this_torch_lacks_is_refused_with_its_name_setting_and_release(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tiered = versions.FEATURES["tiered compilation"]
    monkeypatch.setitem(
        versions.FEATURES,
        "tiered compilation",
        versions.Feature(tiered.name, tiered.needs, "9.9", lambda: False),
    )
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    forwards = [layer.forward for layer in model]
    with pytest.raises(ConfigError) as raised:
        torchkiln.compile(model, backend="aot_eager", tiered=True)
    (problem,) = raised.value.problems
    assert problem.path == "$.tiered.enabled"
    assert problem.message == (
        f"tiered compilation needs {versions.SAVED_FUNCTIONS}, which torch "
        f"{versions.torch_release()} lacks (torch 9.9 or later has it)"
    )
    assert not torchkiln.is_compiled(model)
    assert [layer.forward for layer in model] == forwards


ARTIFACTS = object()
"""Stands for a fresh directory in :data:`ASKING` (the test's ``tmp_path``)."""

ASKING = [
    pytest.param("tiered compilation", "tiered.enabled", {"tiered": True}, id="tiered"),
    pytest.param("precompiled artifacts", "artifacts", {"artifacts": ARTIFACTS}, id="artifacts"),
    pytest.param(
        "hierarchical compilation",
        "regions.strategy",
        {"regions": "hierarchical"},
        id="hierarchical",
    ),
]
"""Each version-gated feature, the setting that asks for it and the options that set it."""


def test_every_feature_has_a_setting_that_asks_for_it() -> None:
    assert {case.values[0] for case in ASKING} == set(versions.FEATURES)


@pytest.mark.parametrize(("feature", "setting", "options"), ASKING)
def test_this_torch_refuses_each_feature_it_lacks_by_name_and_release(
    feature: str, setting: str, options: dict[str, object], tmp_path: Path
) -> None:
    """The real refusal on the real torch (the needs_feature marker skips with this text)."""
    missing = versions.feature_problem(feature)
    if missing is None:
        pytest.skip(f"torch {versions.torch_release()} has {feature}: nothing to refuse")
    since = versions.FEATURES[feature].since
    assert missing.startswith(f"{feature} needs ")
    assert f"which torch {versions.torch_release()} lacks (torch {since} or later" in missing
    options = {k: str(tmp_path) if v is ARTIFACTS else v for k, v in options.items()}
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    with pytest.raises(ConfigError) as raised:
        torchkiln.plan(model, backend="aot_eager", **options)
    (problem,) = raised.value.problems
    assert (problem.path, problem.message, problem.source) == (f"$.{setting}", missing, "argument")
    assert list(tmp_path.iterdir()) == []  # nothing written into the artifact directory


def test_precompile_on_a_torch_without_saved_functions_names_the_feature(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = versions.feature_problem("precompiled artifacts")
    if missing is None:
        pytest.skip(f"torch {versions.torch_release()} has precompiled artifacts")
    from precompile_models import inputs, stack

    from torchkiln import cli
    from torchkiln.artifacts.directory import ArtifactError

    model = stack()
    forwards = [block.forward for block in model.blocks]
    with pytest.raises(ArtifactError) as raised:
        torchkiln.precompile(model, inputs(), tmp_path / "artifacts", backend="aot_eager")
    assert str(raised.value) == f"torchkiln.precompile: {missing}"
    assert not (tmp_path / "artifacts").exists()
    assert [block.forward for block in model.blocks] == forwards
    # The command says the same in one line, exit status 2.
    output = tmp_path / "cli-artifacts"
    argv = ["precompile", "precompile_models:stack", "-o", str(output), "--backend", "aot_eager"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"torchkiln: error: torchkiln.precompile: {missing}\n"
    assert not output.exists()
