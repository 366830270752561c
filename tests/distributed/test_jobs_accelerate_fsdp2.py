"""One compile per job for an unmodified Accelerate FSDP2 program with regional compilation
(``FullyShardedDataParallelPlugin(fsdp_version=2)``, ``TorchDynamoPlugin(backend="inductor",
use_regional_compilation=True)``) after ``torchkiln.compat.accelerate.install()``: 2 ranks,
gloo, CPU. Accelerate compiles before ``fully_shard``, with torchkiln's strategy ``none``; the
groups are shared through torch's caches as under torchkiln's own ``fsdp2`` (a sharded block
cannot load a saved function: ``KeyError: 'gradient_checkpointing'``). Accelerate's activation
checkpointing (``checkpoint_wrapper``) and its offload (``offload_wrapper``) keep training as
Accelerate's own regional compile does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from launching import max_param_diff, read_ranks, torchrun

pytestmark = [pytest.mark.distributed, pytest.mark.needs_feature("precompiled artifacts")]

WORKER = Path(__file__).parent / "accelerate_fsdp2_worker.py"
PARAM_TOL = 1e-4
"""As tests/distributed/test_fsdp2.py."""
GROUPS = ["LlamaDecoderLayer", "Embedding", "LlamaRMSNorm", "Linear"]
"""Accelerate's regional selection: the blocks, then each parameterised leaf outside them."""
SHARED = "shared through torch's caches ("


def job(
    tmp_path: Path, name: str, env: dict[str, str] | None = None, **settings: Any
) -> tuple[Path, list[dict[str, Any]]]:
    pytest.importorskip("accelerate")
    out = tmp_path / name
    out.mkdir()
    # HF_HOME: no accelerate config file of the machine's takes part.
    env = {"HF_HOME": str(out / "hf"), **(env or {})}
    process = torchrun(WORKER, [str(out), json.dumps(settings)], cwd=out, env=env)
    return out, read_ranks(out, process)


def assert_shared(ranks: list[dict[str, Any]], groups: list[str]) -> None:
    """Rank 0 compiled each group and sent it; rank 1 hit its AOTAutograd entries."""
    source, receiver = ranks
    assert source["job_lines"][0] == "job: rank 0 of 2, compiled once per job"
    assert [line.split(":")[0].strip() for line in source["job_lines"][1:]] == groups
    for line in source["job_lines"][1:]:
        assert f": compiled, sent to rank(s) 1, {SHARED}" in line, source["job_lines"]
        assert "did not fit" not in line, source["job_lines"]
    for line in receiver["job_lines"][1:]:
        assert f": serving from rank 0, {SHARED}" in line, receiver["job_lines"]
        assert "did not fit" not in line, receiver["job_lines"]
    counters = receiver["cache_counters"]
    assert counters.get("aot_autograd.autograd_cache_hit", 0) >= len(groups), counters
    assert counters.get("aot_autograd.autograd_cache_miss", 0) == 0, counters
    assert counters.get("inductor.fxgraph_cache_miss", 0) == 0, counters


def test_accelerate_fsdp2_program_compiles_once_per_job(tmp_path: Path) -> None:
    # The reference: each rank compiles its own (aot_eager, within PARAM_TOL of inductor).
    alone, ranks = job(tmp_path, "alone", {"TORCHKILN_JOB_SHARE": "off"}, backend="aot_eager")
    assert all("job.share is off" in r["job_lines"][0] for r in ranks)
    out, ranks = job(tmp_path, "shared", backend="inductor")
    for r in ranks:  # Accelerate sharded each block after torchkiln compiled it
        assert r["fsdp_blocks"].count("FSDPLlamaDecoderLayer") == 2
    assert_shared(ranks, GROUPS)
    assert ranks[0]["losses"] != ranks[1]["losses"]  # each rank its own batches
    assert max_param_diff(out, alone) < PARAM_TOL


def test_accelerate_activation_checkpointing_and_offload(tmp_path: Path) -> None:
    """Accelerate's ``activation_checkpointing`` wraps each block in ``checkpoint_wrapper``
    before compiling: the wrapper is the group, shared with every block's calls fitting it (the
    KV cache transformers builds in training goes through the layer views inside the wrapper).
    ``activation_checkpointing_offload`` adds ``offload_wrapper`` (``save_on_cpu``), where
    Dynamo breaks the graph (``save_on_cpu.__init__`` is skipped), under Accelerate's own
    compile too: that group is compiled on each rank, the report says why, and the training
    equals Accelerate's own."""
    _, ranks = job(tmp_path, "checkpointing", backend="aot_eager", checkpointing=True)
    assert_shared(ranks, ["CheckpointWrapper", *GROUPS[1:]])

    theirs, their_ranks = job(
        tmp_path, "accelerate", backend="aot_eager", checkpointing=True, offload=True,
        torchkiln=False,
    )  # fmt: skip
    ours, ranks = job(tmp_path, "offload", backend="aot_eager", checkpointing=True, offload=True)
    offload_lines = [r["job_lines"][1] for r in ranks]
    assert offload_lines[0].startswith("  OffloadWrapper: compiled, sent to rank(s) 1 (")
    assert (
        "the compile for sharing failed: Unsupported: Attempted to inline function marked as skipped"
        in offload_lines[0]
    )
    assert "rank 0 could not compile it for sharing" in offload_lines[1]
    for r in ranks:
        assert all(SHARED in line for line in r["job_lines"][2:]), r["job_lines"]
    assert [r["losses"] for r in ranks] == [r["losses"] for r in their_ranks]
    assert max_param_diff(ours, theirs) == 0.0
