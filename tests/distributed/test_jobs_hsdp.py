"""One compile per job under HSDP (``distributed.fsdp2.replicate_degree``), in a real 4-process
job (gloo, CPU, inductor): a 2 x 2 mesh, 2 replicas of 2 shards. As under FSDP2
(``test_jobs_fsdp2.py``) rank 0 compiles and sends to ranks 1, 2 and 3 (its shard peer and both
ranks of the other replica), which load its saved function and compile nothing (Dynamo's graph
counter). The trained shards equal a job where each rank compiled its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from launching import max_param_diff, read_ranks, torchrun

pytestmark = [pytest.mark.distributed, pytest.mark.needs_feature("precompiled artifacts")]

WORKER = Path(__file__).parent / "job_worker.py"
RANKS = 4
PARAM_TOL = 1e-4
"""As tests/distributed/test_fsdp2.py."""
SETTINGS = {"strategy": "fsdp2", "replicate_degree": 2, "depth": 2, "steps": 2, "save_params": True}


def job(tmp_path: Path, name: str, **settings: Any) -> tuple[Path, list[dict[str, Any]]]:
    out = tmp_path / name
    out.mkdir()
    settings = {"backend": "inductor", **SETTINGS, **settings}
    process = torchrun(WORKER, [str(out), json.dumps(settings)], cwd=out, nproc=RANKS)
    return out, read_ranks(out, process, nproc=RANKS)


def test_hsdp_group_is_compiled_once_per_job(tmp_path: Path) -> None:
    # The reference: each rank compiles its own, with aot_eager to keep CI short (within
    # PARAM_TOL of inductor's numbers, as in test_jobs_fsdp2.py).
    alone, ranks = job(tmp_path, "alone", share="off", backend="aot_eager")
    assert all("job.share is off" in r["job_lines"][0] for r in ranks)

    out, ranks = job(tmp_path, "shared")
    assert [[g["role"] for g in r["groups"]] for r in ranks] == [
        ["compiled"],
        ["received"],
        ["received"],
        ["received"],
    ]
    assert ranks[0]["job_lines"][1].startswith(
        "  LlamaDecoderLayer: compiled, sent to rank(s) 1, 2, 3, shared as a saved function ("
    ), ranks[0]["job_lines"]
    for r in ranks[1:]:
        assert r["job_lines"][1].startswith(
            "  LlamaDecoderLayer: serving from rank 0, shared as a saved function ("
        ), r["job_lines"]
        assert "did not fit" not in r["job_lines"][1]
    # A backend compiled the group on rank 0 only: the receivers traced it for the check
    assert ranks[0]["compiled_graphs"] >= 1
    assert [r["compiled_graphs"] for r in ranks[1:]] == [0, 0, 0]
    # each replica trains on its own batches, and the replicas hold the same shards
    assert ranks[0]["losses"] != ranks[2]["losses"]
    for rank in (0, 1):
        mine, replica = (
            torch.load(out / f"params{rank}.pt"),
            torch.load(out / f"params{rank + 2}.pt"),
        )
        assert all(torch.equal(mine[n], replica[n]) for n in mine)
    assert max_param_diff(out, alone, RANKS) < PARAM_TOL
