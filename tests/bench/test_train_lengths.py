"""``torchkiln bench --workload train --lengths ...``: the lengths every strategy trains on, the
summary of one run, and the table (the runs themselves are measured by hand: docs/tiered.md)."""

from __future__ import annotations

import pytest

from torchkiln.bench.train_lengths import lengths_for, render, summary
from torchkiln.cli import main


def test_every_strategy_trains_on_the_same_lengths_drawn_from_the_list() -> None:
    settings = {"lengths": [96, 112, 128], "steps": 50, "seed": 0}
    drawn = lengths_for(settings)
    assert drawn == lengths_for(dict(settings)) and len(drawn) == 50
    assert set(drawn) == {96, 112, 128}


def run(strategy: str, seconds: list[float], tiers: dict | None = None, at=None) -> dict:
    return {"strategy": strategy, "step_seconds": seconds, "tiers": tiers,
            "tiers_at": at or [None] * len(seconds)}  # fmt: skip


def test_the_summary_and_table_of_a_run_that_switched() -> None:
    cost = (
        "builder's cost to the steps: 1.02x (median of 1 steps with it running / 1 with "
        "it paused); bound 1.25x"
    )
    tiers = {"state": "serving", "reason": None, "switched_at_call": 4, "calls": {},
             "builder_processes": 2, "seconds_to_switch": 25.3, "misses": 2,
             "lines": ["tiers: serving whole-model", f"  {cost}"]}  # fmt: skip
    runs = {
        "full": run("full", [50.0, 0.10, 0.10, 0.10, 0.10, 0.10]),
        "regional": run("regional", [25.0, 0.12, 0.12, 0.12, 0.12, 0.12]),
        "tiered": run(
            "tiered",
            [25.0, 0.14, 0.15, 0.11, 0.10, 0.10],
            tiers,
            ["building", "building", "building", "serving", "serving", "serving"],
        ),
    }
    # after the switch, in the tiered process: 3 rounds of a tiered step, then a full step
    runs["tiered"]["alternating"] = {"tiered_s": [0.10, 0.11, 0.12], "full_s": [0.10, 0.10, 0.12]}
    summaries = {name: summary(r) for name, r in runs.items()}
    tiered = summaries["tiered"]
    assert tiered["building_median_s"] == pytest.approx(0.145)  # steps 2 and 3
    assert tiered["after_switch_median_s"] == pytest.approx(0.10)  # steps 5 and 6
    settings = {"model": "llama", "depth": 8, "batch": 2, "lengths": [96, 128], "steps": 6,
                "backend": "inductor", "threads": 1}  # fmt: skip
    lines = render({"settings": settings, "runs": runs, "summary": summaries}).splitlines()
    assert lines[0] == (
        "torchkiln bench --lengths: llama depth 8, batch 2, 6 training steps (AdamW), lengths "
        "from 96 to 128 (2 values), inductor, torch threads 1"
    )
    assert lines[4].split() == ["tiered", "25.0", "110", "25.6"]
    assert (
        "  tiered: switched at step 4, 25.3 s after the first step began (0.51x full compile's "
        "first step)"
    ) in lines
    assert "  tiered: builder processes 2" in lines
    assert f"  tiered: {cost}" in lines
    assert "  tiered: 2 steps outside the whole-model form ran regionally" in lines
    assert "  tiered median step while building / regional's: 1.21" in lines
    assert "  tiered median step after the switch / full's: 1.00" in lines
    assert (
        "  tiered step after the switch / full's, alternating in one process (3 rounds): 1.100"
    ) in lines  # medians 0.11 / 0.10
    assert f"  tiered total / regional total: {25.6 / 25.6:.2f}" in lines


def test_lengths_need_the_training_workload(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--lengths", "96,128"]) != 0
    assert "--lengths draws a sequence length per training step" in capsys.readouterr().err
