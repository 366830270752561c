"""``torchkiln bench --ranks N``: the table and targets it prints from one run's numbers (the
launches themselves are measured by hand: docs/jobs.md, "Measuring it")."""

from __future__ import annotations

import pytest

from torchkiln.bench.jobs import render
from torchkiln.cli import main


def rank(r: int, first: float, cpu: float, job: list[str] | None = None, **extra: object) -> dict:
    return {"rank": r, "first_step_s": first, "first_step_cpu_s": cpu, "later_step_s": 0.2,
            "job": job, "switched_at_step": None, "builder_processes": 0, "steps": 6,
            **extra}  # fmt: skip


def test_the_table_shows_each_job_and_whether_the_targets_are_met() -> None:
    result = {
        "settings": {
            "ranks": 2,
            "model": "llama",
            "depth": 16,
            "batch": 1,
            "seq": 128,
            "backend": "inductor",
        },
        "runs": {
            "1 rank": {"ranks": [rank(0, 20.0, 30.0)], "cold_start_s": 25.0},
            "2 ranks, once per job": {
                "ranks": [rank(0, 21.0, 31.0, ["job: rank 0 of 2"]), rank(1, 21.0, 2.0)],
                "cold_start_s": 27.5,
            },
            "2 ranks, restart": {
                "ranks": [rank(0, 2.0, 2.5), rank(1, 3.5, 2.5)],
                "cold_start_s": 8.0,
            },
            "2 ranks, tiered": {
                "ranks": [
                    rank(0, 22.0, 30.0, switched_at_step=31, builder_processes=1),
                    rank(1, 22.0, 30.0, switched_at_step=31),
                ],
                "cold_start_s": 28.0,
            },
        },
        "ratios": {"cold_vs_one": 1.1, "cpu_vs_one": 33 / 30, "restart_vs_cold": 3.5 / 21},
    }
    lines = render(result).splitlines()
    assert lines[0].startswith("torchkiln bench --ranks 2: llama depth 16, batch 1, seq 128")
    assert lines[3].split()[:6] == ["2", "ranks,", "once", "per", "job", "27.5"]
    assert "1.10" in lines[3] and "21.0, 21.0" in lines[3] and "31.0, 2.0" in lines[3]
    assert "  tiered: every rank switched at call 31; builder processes per rank [1, 0]" in lines
    assert "  target cold start, N ranks once per job / 1 rank: 1.10 (at most 1.15): met" in lines
    assert "  target compile CPU-s summed over ranks / 1 rank's: 1.10 (at most 1.2): met" in lines
    assert (
        "  target restart first step / cold first step (worst rank): 0.17 (at most 0.15): NOT met"
        in lines
    )
    assert "  [2 ranks, once per job, rank 0] job: rank 0 of 2" in lines


def test_a_job_of_one_rank_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--ranks", "1"]) != 0
    assert (
        "torchkiln: error: --ranks 1: a job bench needs at least 2 ranks" in capsys.readouterr().err
    )
