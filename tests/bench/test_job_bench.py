"""``torchkiln bench --ranks N``: the table and targets it prints from one run's numbers (the
launches themselves are measured by hand: docs/jobs.md, "Measuring it")."""

from __future__ import annotations

import pytest

from torchkiln.bench.jobs import alternating_ratio, render, worst_ratio
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
    assert not any("full torch.compile" in line for line in lines)  # a run from before it


def test_the_restart_is_held_against_full_compile_and_the_form_it_serves() -> None:
    """The store's restart: its first step against full torch.compile's cold one, its steps
    against a reference compiled in the same process, alternating (here regional: the first
    job's builder did not run)."""
    regional = [rank(0, 20.0, 30.0), rank(1, 21.0, 2.0)]
    full = [rank(0, 40.0, 45.0), rank(1, 41.0, 45.0)]
    alternating = [
        {"reference": "regional", "rounds": 20, "mine_s": 0.21, "reference_s": 0.2},
        {"reference": "regional", "rounds": 20, "mine_s": 0.2, "reference_s": 0.2},
    ]
    restart = [rank(r, 2.0 + r, 2.5, serving="regional", alternating=alternating[r])
               for r in (0, 1)]  # fmt: skip
    runs = {
        "1 rank": {"ranks": [rank(0, 20.0, 30.0)], "cold_start_s": 25.0},
        "2 ranks, full torch.compile": {"ranks": full, "cold_start_s": 45.0},
        "2 ranks, once per job": {"ranks": regional, "cold_start_s": 27.5},
        "2 ranks, restart": {"ranks": restart, "cold_start_s": 8.0},
    }
    ratios = {
        "restart_vs_full": worst_ratio(runs["2 ranks, restart"],
                                       runs["2 ranks, full torch.compile"], "first_step_s"),
        "restart_steady": alternating_ratio(runs["2 ranks, restart"]),
    }  # fmt: skip
    assert ratios == {"restart_vs_full": 3.0 / 41.0, "restart_steady": pytest.approx(1.05)}
    settings = {"ranks": 2, "model": "llama", "depth": 16, "batch": 1, "seq": 128,
                "backend": "inductor"}  # fmt: skip
    lines = render({"settings": settings, "runs": runs, "ratios": ratios}).splitlines()
    assert (
        "  restart, alternating with regional compiled in each rank's process (20 rounds): "
        "step 210, 200 ms against 200, 200 ms" in lines
    )
    assert (
        "  target restart first step / full torch.compile's cold one (worst rank): 0.07 "
        "(at most 0.1): met" in lines
    )
    assert (
        "  target restart later step / the same form compiled in its process (worst rank): 1.05 "
        "(at most 1.02): NOT met" in lines
    )
    assert not any("cold start, N ranks" in line for line in lines)  # no ratio, no target line


def test_a_job_of_one_rank_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--ranks", "1"]) != 0
    assert (
        "torchkiln: error: --ranks 1: a job bench needs at least 2 ranks" in capsys.readouterr().err
    )
