"""FSDP2: checkpointing, in-place compile, then fully_shard per region and on the root;
checked against hand-written fully_shard in 2 processes on a CPU mesh."""

from __future__ import annotations

import pytest

from torchkiln._internals.versions import feature_problem

pytestmark = pytest.mark.distributed

LOSS_TOL = 1e-4
PARAM_TOL = 1e-4


@pytest.fixture(scope="module")
def ranks(run_worker):
    return run_worker("fsdp2")


def assert_close(got, want):
    assert len(got) == len(want) == 3
    for a, b in zip(got, want, strict=True):
        assert abs(a - b) < LOSS_TOL, (got, want)


SHARED = feature_problem("precompiled artifacts") is None
"""Whether this torch shares compiled groups between ranks (2.11 has no ``aot_compile``: every
rank compiles its own there)."""


def served_status(rank: int) -> str:
    """A region's status where rank 0 compiles each group and shares it (docs/jobs.md): rank 0's
    code is ``compiled``, the other ranks' ``serving`` (from rank 0; one vocabulary of states)."""
    return "compiled" if rank == 0 or not SHARED else "serving"


def test_losses_match_uncompiled_fsdp2(ranks):
    for data in ranks:
        assert data["returned_is_model"] is True
        assert_close(data["losses"], data["reference_losses"])
    assert ranks[0]["losses"][0] != ranks[0]["losses"][-1]


def test_blocks_sharded_on_a_cpu_mesh(ranks):
    assert ranks[0]["sharded_layers"] == [True, True]
    assert ranks[0]["mesh_device"] == "cpu"


def test_fsdp_hooks_still_fire_around_compiled_blocks(ranks):
    hooks = ranks[0]["hooks"]
    # 2 blocks x 3 steps: all-gathered before each block's forward, resharded after.
    assert hooks["unsharded_in_forward"] == [True, 6]
    assert hooks["resharded_after"] == [True, 6]


def test_every_region_runs_compiled_code(ranks):
    """Rank 0 compiles each group (with and without checkpointing: two keys), rank 1 serves
    its saved function and compiles nothing (docs/jobs.md, "Two ways to share")."""
    for rank, data in enumerate(ranks):
        for key in ("regions", "ac_regions"):
            regions = data[key]
            assert [r["path"] for r in regions] == ["model.layers.0", "model.layers.1"]
            assert [r["status"] for r in regions] == [served_status(rank)] * 2, regions
            assert (regions[0]["graphs"] >= 1) == (rank == 0 or not SHARED)
        assert (data["new_compiled_graphs"] >= 1) == (rank == 0 or not SHARED)


def test_full_state_dict_gathered_to_rank0_with_plain_keys(ranks):
    for key in ("state_dict", "ac_state_dict"):
        state = ranks[0][key]
        assert state["keys_match"], (state["extra_keys"], state["missing_keys"])
        assert state["load_error"] is None
        assert state["reloaded_equal"] is True
        assert ranks[1][key]["size"] == 0
    assert ranks[0]["state_dict"]["max_diff_vs_reference"] < PARAM_TOL
    # Gathered on every rank when asked.
    assert [r["state_dict_all_ranks_size"] for r in ranks] == [ranks[0]["state_dict"]["size"]] * 2
    # Activation checkpointing recomputes the same values: the same trained weights.
    assert ranks[0]["ac_state_dict"]["max_diff_vs_reference"] < PARAM_TOL


def test_activation_checkpointing_recomputes_blocks(ranks):
    data = ranks[0]
    assert_close(data["ac_losses"], data["reference_losses"])
    # Checkpointed blocks keep only their inputs for the backward (autograd's own count).
    assert data["ac_saved"] < data["plain_saved"] / 2, (data["ac_saved"], data["plain_saved"])


@pytest.fixture(scope="module")
def checkpointing_inductor(run_worker):
    return run_worker("fsdp2-checkpointing-inductor")


def test_checkpointing_with_inductor_trains_exactly(checkpointing_inductor):
    """pytorch#166926: composable checkpoint around an inductor-compiled block raised
    CheckpointError at the first backward; the checkpoint is now traced into the block."""
    for rank, data in enumerate(checkpointing_inductor):
        assert "error" not in data, data.get("error")
        assert data["backend"] == "inductor"
        assert_close(data["losses"], data["reference_losses"])
        statuses = [r["status"] for r in data["regions"]]
        assert statuses == [served_status(rank)] * 2, data["regions"]
        # rank 1 loaded rank 0's code
        assert (data["regions"][0]["graphs"] >= 1) == (rank == 0 or not SHARED)
        assert data["regions"][0]["graph_breaks"] == 0
        assert data["saved"] < data["reference_saved"] / 2, (data["saved"], data["reference_saved"])
        assert data["eval_max_diff"] < 1e-4
        assert any("activation checkpointing" in note for note in data["notes"])
    state = checkpointing_inductor[0]["state_dict"]
    assert state["keys_match"] and state["load_error"] is None
    assert state["max_diff_vs_reference"] < PARAM_TOL


def test_dynamo_flags_only_when_asked_and_restored_by_decompile(ranks):
    data = ranks[0]
    assert data["flags_untouched"] is True
    assert data["ac_flags_on"] is True
    assert data["ac_flags_restored"] is True


def test_sharding_a_sharded_model_again_is_refused(ranks):
    error = ranks[0]["wrap_sharded_again"]
    assert error["type"] == "DistributedError"
    assert "already sharded by FSDP2" in error["message"]


def test_mixed_precision_from_configuration_matches_fully_shard_with_the_policy(ranks):
    for data in ranks:
        assert data["mp_policy"] == {
            "param_dtype": "torch.bfloat16",
            "reduce_dtype": "torch.float32",
            "output_dtype": "None",
            "cast_forward_inputs": "True",
        }
        assert_close(data["mp_losses"], data["mp_reference_losses"])
        # bf16 compute really happened: other losses than in float32, bf16 logits ...
        assert data["mp_losses"] != data["losses"]
        assert data["mp_logits_dtype"] == "torch.bfloat16"
        # ... while the sharded parameters the optimizer updates stayed float32.
        assert data["mp_sharded_dtypes"] == ["torch.float32"]
        assert {r["status"] for r in data["mp_regions"]} <= {"compiled", "serving"}
    state = ranks[0]["mp_state_dict"]
    assert state["keys_match"] and state["load_error"] is None
    assert state["max_diff_vs_reference"] < PARAM_TOL


def test_hsdp_from_configuration_matches_fully_shard_on_the_same_mesh(ranks):
    for data in ranks:
        assert data["hsdp_mesh"] == [[2, 1], ["replicate", "shard"]]
        assert_close(data["hsdp_losses"], data["hsdp_reference_losses"])
        assert {r["status"] for r in data["hsdp_regions"]} <= {"compiled", "serving"}
    state = ranks[0]["hsdp_state_dict"]
    assert state["keys_match"] and state["load_error"] is None
    assert state["max_diff_vs_reference"] < PARAM_TOL
    error = ranks[0]["hsdp_bad_degree"]
    assert error["type"] == "DistributedError"
    assert "replicate_degree=3 does not divide the world size 2" in error["message"]
