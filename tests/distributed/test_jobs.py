"""Compiling once per job, in real 2-process jobs (gloo, CPU): one rank compiles each region
group, the other loads it; a store makes a restart compile nothing; each fault ends as the
docs say (docs/jobs.md). Dynamo's own graph counter on each rank is the witness of who
compiled."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from launching import describe, free_port, launch_nodes, read_ranks, torchrun

pytestmark = [pytest.mark.distributed, pytest.mark.needs_feature("precompiled artifacts")]

WORKER = Path(__file__).parent / "job_worker.py"


def job(tmp_path: Path, name: str, **settings: Any) -> list[dict[str, Any]]:
    out = tmp_path / name
    out.mkdir()
    return read_ranks(out, torchrun(WORKER, [str(out), json.dumps(settings)], cwd=out))


def by_hand(tmp_path: Path, name: str, **settings: Any) -> tuple[Any, list[dict[str, Any]]]:
    """Two ranks started as plain processes: one dying does not stop the other."""
    out = tmp_path / name
    out.mkdir()

    def commands() -> list[list[str]]:
        port = free_port()
        return [
            [sys.executable, str(WORKER), str(out),
             json.dumps({**settings, "init": {"port": port, "rank": rank}})]
            for rank in (0, 1)
        ]  # fmt: skip

    process = launch_nodes(commands, cwd=out)
    found = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    return process, found


def roles(ranks: list[dict[str, Any]]) -> list[list[str]]:
    return [[g["role"] for g in r["groups"]] for r in ranks]


def test_one_rank_compiles_and_the_other_loads_with_equal_losses(tmp_path: Path) -> None:
    shared = job(tmp_path, "shared")
    alone = job(tmp_path, "alone", share="off")
    assert roles(shared) == [["compiled"], ["received"]]
    assert [g["source"] for r in shared for g in r["groups"]] == [0, 0]
    assert shared[1]["groups"][0]["bytes"] == shared[0]["groups"][0]["bytes"] > 0
    # A backend compiled the group on rank 0 only; without sharing, on both
    assert shared[0]["compiled_graphs"] >= 1 and shared[1]["compiled_graphs"] == 0
    # The report's regions say the same (issue 41): rank 0 compiled it (its compile seconds are
    # the job's), rank 1 loaded what rank 0 sent, in the job's load time, compiling nothing.
    compiled, received = (r["regions"][0] for r in shared)
    assert compiled["compile_seconds"] >= shared[0]["groups"][0]["compile_seconds"] - 1e-6 > 0
    assert compiled["loaded_from"] is None
    assert (received["loaded_from"], received["compile_seconds"], received["graphs"]) == (
        "rank 0",
        0.0,
        0,
    )
    assert received["load_seconds"] == shared[1]["load_seconds"][0] > 0
    assert all(r["compiled_graphs"] >= 1 for r in alone)
    assert [r["sharing"] for r in alone] == [False, False]
    assert "job.share is off" in alone[0]["job_lines"][0]
    for with_share, without in zip(shared, alone, strict=True):
        assert with_share["losses"] == pytest.approx(without["losses"], rel=1e-5)


def test_a_job_restarted_with_one_store_loads_its_kernels_and_entries_and_compiles_nothing(
    tmp_path: Path,
) -> None:
    """``store=DIR`` alone (no cache_dir): inductor's kernels and the job's entries in one
    directory; the restart loads every group from it. (``job.store`` alone restarts the same way
    in test_jobs_docs.py, through the docs' command.)"""
    store = tmp_path / "one-store"
    cold = job(tmp_path, "cold", backend="inductor", one_store=str(store))
    warm = job(tmp_path, "warm", backend="inductor", one_store=str(store))
    assert roles(cold) == [["compiled"], ["received"]]
    assert all(g["stored"] for r in cold for g in r["groups"])
    assert roles(warm) == [["store"], ["store"]]
    assert [r["compiled_graphs"] for r in warm] == [0, 0]
    assert [g["compile_seconds"] for r in warm for g in r["groups"]] == [0.0, 0.0]
    # and the report's table says loaded from the store, not "compile s 0.00" (issue 41)
    assert [(r["regions"][0]["loaded_from"], r["regions"][0]["compile_seconds"]) for r in warm] == [
        ("store", 0.0),
        ("store", 0.0),
    ]
    assert any((store / "kernels").iterdir())  # inductor's caches went into the store
    entries = list((store / "entries").iterdir())
    assert len(entries) == 1 and not entries[0].name.startswith(".")  # one entry, published
    # the compile's CPU time is gone from the restarted job's first step
    assert warm[0]["first_step_cpu"] < 0.3 * cold[0]["first_step_cpu"]
    for first, again in zip(cold, warm, strict=True):
        assert again["losses"] == pytest.approx(first["losses"], rel=1e-5)


def test_two_nodes_with_their_own_stores_the_second_compiles_nothing(tmp_path: Path) -> None:
    out = tmp_path / "nodes"
    out.mkdir()
    settings = json.dumps({"store": str(tmp_path / "node{node}-store")})

    def nodes() -> list[list[str]]:
        port = free_port()
        return [
            [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
             f"--node_rank={node}", "--master_addr=127.0.0.1", f"--master_port={port}",
             str(WORKER), str(out), settings]
            for node in (0, 1)
        ]  # fmt: skip

    ranks = read_ranks(out, launch_nodes(nodes, cwd=out))
    assert roles(ranks) == [["compiled"], ["received"]]
    assert [r["compiled_graphs"] >= 1 for r in ranks] == [True, False]
    for node in (0, 1):  # each node's own store holds the entry now
        entries = list((tmp_path / f"node{node}-store" / "entries").iterdir())
        assert [e.name.startswith(".") for e in entries] == [False]


def test_a_rank_with_another_model_compiles_its_own_and_says_why(tmp_path: Path) -> None:
    ranks = job(tmp_path, "differ", strategy="none", fault="differ")
    assert roles(ranks) == [["compiled"], ["compiled"]]
    assert all(r["compiled_graphs"] >= 1 for r in ranks)
    # a wider model: other parameter shapes, and hidden states of another width
    reason = ranks[1]["groups"][0]["reason"]
    assert reason.startswith(
        "this rank's key differs from rank 0's in: structure, attributes, inputs ("
    )
    assert "hidden_size: 96 here, 64 on rank 0" in reason
    assert ranks[0]["groups"][0]["reason"] is None


RANK_HAZARDS = {
    # A block attribute that differs by rank (its attention scaling): the key holds the blocks'
    # plain attributes, so the group keys apart and rank 1 compiles its own for the job.
    "rank_constant": (
        "compiled",
        "this rank's key differs from rank 0's in: attributes (",
        ("self_attn.scaling: ", "on rank 0"),
    ),
    # The hazard no key sees: the blocks' code reads torch.distributed.get_rank(), which Dynamo
    # folds into the graph as a constant, unguarded. The keys agree, the traced graphs do not.
    "rank_in_code": (
        "local",
        "the graph this rank traced differs from rank 0's (line ",
        ("3.0", "on rank 0"),
    ),
}


@pytest.mark.parametrize("fault", sorted(RANK_HAZARDS))
def test_a_rank_dependent_constant_is_caught_and_the_other_group_still_shared(
    tmp_path: Path, fault: str
) -> None:
    """pytorch#191878's hazard: a block whose code would differ by rank under the same source
    and layout. Rank 1 compiles its own blocks and trains as if alone, the report says why, and
    the rotary embedding's group, equal on both ranks, is still shared."""
    role, starts, said = RANK_HAZARDS[fault]
    regions = {"strategy": "classes", "classes": ["LlamaDecoderLayer", "LlamaRotaryEmbedding"]}
    shared = job(tmp_path, "shared", fault=fault, regions=regions, eager_reference=True)
    by_group = [{g["group"]: g for g in r["groups"]} for r in shared]
    assert [r["LlamaRotaryEmbedding"]["role"] for r in by_group] == ["compiled", "received"]
    assert [r["LlamaDecoderLayer"]["role"] for r in by_group] == ["compiled", role]
    reason = by_group[1]["LlamaDecoderLayer"]["reason"]
    assert reason.startswith(starts) and all(part in reason for part in said), reason
    assert by_group[0]["LlamaDecoderLayer"]["reason"] is None
    assert by_group[1]["LlamaRotaryEmbedding"]["reason"] is None
    # Each rank ran its own rank's code: its first loss is its uncompiled copy's. Rank 0's code
    # on rank 1 would be off by 3.3e-4 (the attention scaling) or 5.3e-3 (the MLP), measured.
    for rank in shared:
        assert rank["losses"][0] == pytest.approx(rank["eager_first_loss"], abs=1e-5)


def test_an_entry_that_does_not_match_is_compiled_on_the_rank_instead(tmp_path: Path) -> None:
    corrupt = job(tmp_path, "corrupt", fault="corrupt")
    alone = job(tmp_path, "alone", share="off")
    assert roles(corrupt) == [["compiled"], ["local"]]
    reason = corrupt[1]["groups"][0]["reason"]
    assert "could not be loaded here" in reason and "does not match the manifest" in reason
    assert corrupt[1]["compiled_graphs"] >= 1  # it compiled itself
    assert corrupt[1]["losses"] == pytest.approx(alone[1]["losses"], rel=1e-5)


def test_a_source_that_dies_mid_compile_fails_the_waiting_rank_naming_it(tmp_path: Path) -> None:
    process, ranks = by_hand(tmp_path, "killed", fault="kill-source", timeout=60)
    assert process.returncode != 0, describe(process)
    assert [r["rank"] for r in ranks] == [1]  # rank 0 died before writing anything
    error = ranks[0]["error"]
    assert error.startswith("JobError: rank 1: rank 0 failed or left while this rank waited for")
    assert "group 'LlamaDecoderLayer'" in error


def test_a_rank_that_never_arrives_is_named_at_the_timeout(tmp_path: Path) -> None:
    # a plain process group: under DDP its own forward collectives would wait for rank 1 first
    process, ranks = by_hand(tmp_path, "late", fault="late", timeout=5, strategy="none")
    assert [r["rank"] for r in ranks] == [0, 1], describe(process)
    error = ranks[0].get("error", "")
    assert error.startswith(
        "JobError: rank 0: not every rank of the job reached group 'LlamaDecoderLayer''s first "
        "call within 5 s (job.timeout): "
    )
    assert "1" in error.split("(job.timeout): ", 1)[1]  # gloo's message names rank 1
