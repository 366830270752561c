"""``torchkiln bench --store``: the one-store cell (docs/store.md, docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from torchkiln.bench.store_restart import ratios, table

RESULTS = [
    {"role": "full", "compile_seconds": 1.0, "first_call_seconds": 39.0, "steady_seconds": 0.02},
    {"role": "store-first", "compile_seconds": 0.5, "first_call_seconds": 15.5,
     "steady_seconds": 0.025, "serving": "whole-model"},
    {"role": "store-again", "compile_seconds": 1.9, "first_call_seconds": 0.1,
     "steady_seconds": 0.0204, "full_steady_seconds": 0.02, "serving": "whole-model"},
]  # fmt: skip


def test_the_ratios_are_the_second_runs_start_and_its_alternating_steady_state() -> None:
    found = ratios(RESULTS)
    assert found["start"] == pytest.approx(2.0 / 40.0)
    assert found["steady"] == pytest.approx(1.02)


def test_the_table_has_a_row_per_process_against_full_compiles_cold_start() -> None:
    rows = table(RESULTS).splitlines()
    assert rows[0].startswith("| process | compile + first call | x full cold |")
    assert rows[2] == "| full | 40.00 s | 1.000x | 20.00 ms | - | whole model |"
    assert rows[4] == "| store-again | 2.00 s | 0.050x | 20.40 ms | 1.020x | whole-model |"


@pytest.mark.slow
@pytest.mark.needs_feature("tiered compilation")
def test_the_cell_runs_three_processes_and_writes_its_json(tmp_path: Path) -> None:
    out = tmp_path / "store.json"
    command = [sys.executable, "-m", "torchkiln", "bench", "--store", "--depths", "2"]
    command += ["--backend", "aot_eager", "--json", str(out)]
    process = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    assert process.returncode == 0, process.stderr[-3000:]
    document = json.loads(out.read_text())
    assert [r["role"] for r in document["results"]] == ["full", "store-first", "store-again"]
    first, again = document["results"][1:]
    assert (first["tiers_state"], first["tiers_source"]) == ("serving", "the builder")
    assert again["tiers_state"] == "serving" and again["tiers_source"] != "the builder"
    assert again["calls_until_whole_model"] == 0  # served whole-model from its first call
    assert set(document["ratios"]) == {"start", "steady"}
    assert "target: second run's start <= 0.1x full's" in process.stdout
