"""``torchkiln bench --ranks N``: the table and targets it prints from one run's numbers (the
DDP launches themselves are measured by hand: docs/jobs.md, "Measuring it"), the
``--distributed`` options, and one small real ``--distributed fsdp2`` run."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest

from torchkiln.bench import jobs
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


def test_an_fsdp2_table_says_so_and_holds_it_to_fsdp2s_targets() -> None:
    settings = {"ranks": 2, "model": "llama", "depth": 16, "batch": 1, "seq": 128,
                "backend": "inductor", "distributed": "fsdp2", "checkpointing": True}  # fmt: skip
    shared = "  LlamaDecoderLayer: serving from rank 0, shared as a saved function (load 0.7 s)"
    runs = {
        "1 rank": {"ranks": [rank(0, 20.0, 20.0)], "cold_start_s": 25.0},
        "2 ranks, once per job": {
            "ranks": [rank(0, 21.0, 22.0), rank(1, 21.0, 3.0, ["job: rank 1 of 2", shared])],
            "cold_start_s": 27.0,
        },
    }
    ratios = {"cold_vs_one": 27 / 25, "cpu_vs_one": 25 / 20}
    lines = render({"settings": settings, "runs": runs, "ratios": ratios}).splitlines()
    assert lines[0].startswith(
        "torchkiln bench --ranks 2: llama depth 16, batch 1, seq 128, inductor, distributed fsdp2 "
        "(activation checkpointing on), training steps"
    )
    assert "  target compile CPU-s summed over ranks / 1 rank's: 1.25 (at most 1.25): met" in lines
    assert f"  [2 ranks, once per job, rank 1] {shared.strip()}" in lines
    ddp = render({"settings": {**settings, "distributed": "ddp"}, "runs": runs, "ratios": ratios})
    assert ", inductor, distributed ddp, training steps" in ddp.splitlines()[0]
    assert "compile CPU-s summed over ranks / 1 rank's: 1.25 (at most 1.2): NOT met" in ddp


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ranks", "2", "--distributed", "zero3"],
         "--distributed zero3: the job bench runs ddp or fsdp2"),
        (["--distributed", "fsdp2"], "--distributed fsdp2: the strategy of a job bench's jobs; "
         "add --ranks N (N >= 2)"),
        (["--ranks", "1", "--distributed", "ddp"], "--distributed ddp: the strategy of a job "
         "bench's jobs; add --ranks N (N >= 2)"),
        (["--ranks", "2", "--checkpointing"], "--checkpointing turns on "
         "distributed.fsdp2.activation_checkpointing: add --ranks N --distributed fsdp2"),
    ],
    ids=["unknown", "no-ranks", "one-rank", "checkpointing-under-ddp"],
)  # fmt: skip
def test_distributed_options_a_job_bench_cannot_use_are_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", *argv]) != 0
    assert f"torchkiln: error: {message}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [([], ("ddp", False)), (["--distributed", "fsdp2", "--checkpointing"], ("fsdp2", True))],
    ids=["default-ddp", "fsdp2-checkpointing"],
)
def test_the_job_bench_gets_the_strategy(
    argv: list[str], expected: tuple[str, bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[dict[str, Any]] = []

    def run_job_bench(ranks: int, base: dict[str, Any], *_: object) -> dict[str, Any]:
        seen.append(base)
        return {"ratios": {}}

    monkeypatch.setattr(jobs, "run_job_bench", run_job_bench)
    assert main(["bench", "--ranks", "2", *argv]) == 0
    assert (seen[0]["distributed"], seen[0]["checkpointing"]) == expected


@pytest.mark.distributed
@pytest.mark.needs_feature("precompiled artifacts")
def test_an_fsdp2_job_bench_shares_the_group_and_says_fsdp2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Four real launches, sized for CI's 2 cores: depth 2, aot_eager, 3 steps a rank, 2
    alternating rounds in the restart; activation checkpointing on."""
    monkeypatch.setattr(jobs, "STEPS", 3)
    monkeypatch.setattr(jobs, "ALTERNATE_ROUNDS", 2)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    out = tmp_path / "fsdp2.json"
    argv = ["bench", "--ranks", "2", "--distributed", "fsdp2", "--checkpointing", "--depths", "2",
            "--backend", "aot_eager", "--json", str(out), "--timeout", "300"]  # fmt: skip
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert ", aot_eager, distributed fsdp2 (activation checkpointing on), training" in lines[0]
    document = json.loads(out.read_text())
    settings = document["settings"]
    assert (settings["distributed"], settings["checkpointing"]) == ("fsdp2", True)
    assert list(document["runs"]) == [
        "1 rank", "2 ranks, each compiles", "2 ranks, once per job", "2 ranks, restart"
    ]  # fmt: skip
    assert set(document["ratios"]) == {"cold_vs_one", "cpu_vs_one", "restart_vs_cold",
                                       "restart_steady"}  # fmt: skip
    assert [line.split()[0] for line in lines[2:6]] == ["1", "2", "2", "2"]  # one row a job
    assert (
        "  [2 ranks, once per job, rank 1] LlamaDecoderLayer: serving from rank 0, shared as a "
        "saved function (" in "\n".join(lines)
    )
    assert (
        "  [2 ranks, restart, rank 1] LlamaDecoderLayer: serving from store, shared as a "
        "saved function (" in "\n".join(lines)
    )
    assert any(line.startswith("  target compile CPU-s summed over ranks / 1 rank's: ")
               and "(at most 1.25)" in line for line in lines)  # fmt: skip
