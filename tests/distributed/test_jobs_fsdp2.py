"""One compile per job under FSDP2, in real 2-process jobs (gloo, CPU, inductor): rank 0
compiles each group, rank 1 loads rank 0's saved function (docs/jobs.md, "Two ways to share":
the load keeps the block's fully_shard class, whose MRO a guard indexes) and compiles nothing,
Dynamo's own graph counter the witness. The trained shards equal a job where each rank compiled
its own, with activation checkpointing on (off: test_jobs_hsdp.py, on 4 ranks)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from launching import max_param_diff, read_ranks, torchrun

pytestmark = [pytest.mark.distributed, pytest.mark.needs_feature("precompiled artifacts")]

WORKER = Path(__file__).parent / "job_worker.py"
PARAM_TOL = 1e-4
"""As tests/distributed/test_fsdp2.py."""


def job(tmp_path: Path, name: str, **settings: Any) -> tuple[Path, list[dict[str, Any]]]:
    out = tmp_path / name
    out.mkdir()
    settings = {"backend": "inductor", "strategy": "fsdp2", "save_params": True, **settings}
    return out, read_ranks(out, torchrun(WORKER, [str(out), json.dumps(settings)], cwd=out))


@pytest.fixture(scope="module")
def each_compiles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference: each rank compiles its own, with aot_eager to keep CI short (within
    PARAM_TOL of inductor's numbers; examples/fsdp2_job_bench.py compares against inductor
    compiled on each rank at depth 16: equal to the bit). Activation checkpointing recomputes
    the same values, so it serves the checkpointed job."""
    out, ranks = job(
        tmp_path_factory.mktemp("fsdp2-alone"), "alone", share="off", backend="aot_eager"
    )
    assert all("job.share is off" in r["job_lines"][0] for r in ranks)
    return out


def test_fsdp2_group_is_compiled_once_and_loaded_by_the_other_rank(
    tmp_path: Path, each_compiles: Path
) -> None:
    """With activation checkpointing (the group traces through it); without it, the same job is
    ``test_jobs_hsdp.py``'s on 4 ranks (2 CI minutes are what both variants here would cost)."""
    out, ranks = job(tmp_path, "shared", checkpointing=True)
    for r in ranks:
        assert "error" not in r, r.get("traceback")
    assert [[g["role"] for g in r["groups"]] for r in ranks] == [["compiled"], ["received"]]
    assert ranks[0]["job_lines"][1].startswith(
        "  LlamaDecoderLayer: compiled, sent to rank(s) 1, shared as a saved function ("
    )
    line = ranks[1]["job_lines"][1]
    assert line.startswith("  LlamaDecoderLayer: serving from rank 0, shared as a saved function (")
    assert "did not fit" not in line  # every call of the two steps ran rank 0's code
    # A backend compiled the group on rank 0 only: rank 1 traced it for the check, no more
    assert ranks[0]["compiled_graphs"] >= 1 and ranks[1]["compiled_graphs"] == 0
    assert ranks[1]["first_step_cpu"] < 0.25 * ranks[0]["first_step_cpu"]
    assert max_param_diff(out, each_compiles) < PARAM_TOL
