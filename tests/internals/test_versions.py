"""The tested torch range and version-gated features: one warning outside the range, and a
feature this torch lacks refused by name and release when the configuration is read."""

from __future__ import annotations

import subprocess
import sys
import warnings

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
