"""examples/decode_time_split.py (quoted in docs/generation.md) splits a regional generate()'s
time into graphs, the rest of each block call and the model's code around the blocks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from example_scripts import run_example

pytestmark = pytest.mark.slow

PARTS = ["graphs", "block call, rest", "outside the blocks"]


def test_every_block_call_is_split_into_its_parts(tmp_path: Path) -> None:
    out = tmp_path / "split.json"
    arguments = ["--depth", "2", "--new-tokens", "4", "--rounds", "2", "--json", str(out)]
    process = run_example("decode_time_split.py", *arguments)
    data = json.loads(out.read_text())
    # 4 new tokens: the prefill forward and 3 decode forwards, 2 blocks each, one graph each
    # (no graph break).
    assert data["block_calls"] == 8
    assert data["graph_calls"] == 8
    assert list(data["median_seconds"]) == PARTS
    assert len(data["samples_seconds"]) == 2
    for sample in data["samples_seconds"]:
        assert all(sample[part] > 0 for part in PARTS), sample
    assert len(data["per_token_seconds"]["regional"]) == 2
    assert "full" not in data["per_token_seconds"]  # only with --compare-full
    for part in PARTS:
        assert f"  {part:20s}" in process.stdout
