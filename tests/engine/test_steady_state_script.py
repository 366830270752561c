"""examples/steady_state_guards.py (quoted in docs/guide.md) runs and times every variant."""

from __future__ import annotations

import json

import pytest
from example_scripts import run_example

pytestmark = pytest.mark.slow

VARIANTS = [
    "full",
    "regional",
    "regional, skip nn-module guards",
    "regional, skip global guards",
    "regional, skip_guard_eval_unsafe",
    "full, skip_guard_eval_unsafe",
    "hierarchical",
]


def test_every_variant_is_timed_in_alternating_rounds(tmp_path):
    out = tmp_path / "steady.json"
    arguments = ["--depth", "2", "--seq", "16", "--rounds", "3", "--json", str(out)]
    process = run_example("steady_state_guards.py", *arguments)
    data = json.loads(out.read_text())
    assert list(data["median_s"]) == VARIANTS
    assert all(len(data["samples_s"][name]) == 3 for name in VARIANTS)
    assert all(value > 0 for value in data["median_s"].values())
    assert "full                                   " in process.stdout
    assert "x full 1.000" in process.stdout
