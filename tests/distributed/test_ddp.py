"""DDP: regions compiled in place, then wrapped; checked against hand-written DDP in 2 processes."""

from __future__ import annotations

import pytest

from torchkiln._internals.versions import feature_problem

pytestmark = pytest.mark.distributed

LOSS_TOL = 1e-4
PARAM_TOL = 1e-4


@pytest.fixture(scope="module")
def ranks(run_worker):
    return run_worker("ddp")


SHARED = feature_problem("precompiled artifacts") is None
"""Whether this torch shares compiled groups between ranks (2.11 has no ``aot_compile``: every
rank compiles its own there)."""


def served_status(rank: int) -> str:
    """A region's status where rank 0 compiles each group and shares it (docs/jobs.md): rank 0's
    code is ``compiled``, the other ranks' ``serving`` (from rank 0; one vocabulary of states)."""
    return "compiled" if rank == 0 or not SHARED else "serving"


def test_losses_match_uncompiled_ddp(ranks):
    for data in ranks:
        assert data["world_size"] == 2
        assert data["returned"] == "DistributedDataParallel"
        assert len(data["losses"]) == 3
        for got, want in zip(data["losses"], data["reference_losses"], strict=True):
            assert abs(got - want) < LOSS_TOL, (data["losses"], data["reference_losses"])
    # Training moved the loss: the comparison is not between two untouched models.
    assert ranks[0]["losses"][0] != ranks[0]["losses"][-1]


def test_gradients_all_reduced_params_identical_on_both_ranks(ranks):
    assert ranks[0]["params_checksum"] == ranks[1]["params_checksum"]


def test_every_region_runs_compiled_code_compiled_once_for_the_job(ranks):
    for rank, data in enumerate(ranks):
        regions = data["regions"]
        assert [r["path"] for r in regions] == ["model.layers.0", "model.layers.1"]
        assert [r["status"] for r in regions] == [served_status(rank)] * 2, regions
        assert regions[1]["reused"]
    # rank 0 compiled the block group; rank 1 received it and compiled nothing (docs/jobs.md)
    assert [data["job_roles"] for data in ranks] == [[["compiled", 0]], [["received", 0]]]
    assert ranks[0]["regions"][0]["graphs"] >= 1 and ranks[0]["new_compiled_graphs"] >= 1
    assert ranks[1]["regions"][0]["graphs"] == 0 and ranks[1]["new_compiled_graphs"] == 0


def test_ddp_options_reach_the_wrapper(ranks):
    assert ranks[0]["bucket_bytes_cap"] == 1024 * 1024
    assert ranks[0]["broadcast_buffers"] is False
    assert ranks[0]["unwrap_is_model"] is True


def test_full_state_dict_has_plain_keys_and_loads_back(ranks):
    state = ranks[0]["state_dict"]
    assert state["keys_match"], (state["extra_keys"], state["missing_keys"])
    assert state["load_error"] is None
    assert state["reloaded_equal"] is True
    assert state["max_diff_vs_reference"] < PARAM_TOL
    assert ranks[1]["state_dict"]["size"] == 0  # rank0_only by default
    assert ranks[1]["state_dict_all_ranks_size"] == state["size"]


def test_wrapping_twice_is_refused(ranks):
    again = ranks[0]["wrap_ddp_again"]
    assert again["type"] == "DistributedError"
    assert "already wrapped by" in again["message"]
    assert "DistributedDataParallel" in again["message"]
    held = ranks[0]["wrap_held_module_again"]
    assert held["type"] == "DistributedError"
    assert "still held by the DistributedDataParallel" in held["message"]
    double = ranks[0]["check_result_double"]
    assert double["type"] == "DistributedError"
    assert "DistributedDataParallel -> DistributedDataParallel" in double["message"]


def test_plugin_that_wraps_twice_is_detected_by_compile(ranks):
    error = ranks[0]["plugin_wraps_twice"]
    assert error is not None and error["type"] == "DistributedError", error
    assert "wrapped the model twice" in error["message"]


def test_unknown_ddp_option_names_allowed_ones(ranks):
    error = ranks[0]["bad_option"]
    assert error["type"] == "DistributedError"
    assert "'bucket_size'" in error["message"] and "bucket_cap_mb" in error["message"]


def test_tiered_under_ddp_switches_on_each_rank_with_plain_ddp_losses(run_worker):
    ranks = run_worker("tiered-ddp")
    for data in ranks:
        assert "error" not in data, data.get("error")
        assert data["built"] is True
        half = len(data["losses"]) // 2
        # Regional until the builder finished, the whole-model form from then on.
        assert data["serving"] == ["regional"] * half + ["whole-model"] * half, data["reason"]
        assert data["calls"] == {"regional": half, "whole-model": half}
        for got, want in zip(data["losses"], data["reference_losses"], strict=True):
            assert abs(got - want) < LOSS_TOL, (data["losses"], data["reference_losses"])
        assert abs(data["params_checksum"] - data["reference_checksum"]) < PARAM_TOL
    assert ranks[0]["params_checksum"] == ranks[1]["params_checksum"]
    # one builder for the job (rank 0's), one switch call for both ranks
    assert [r["builder_processes"] for r in ranks] == [1, 0]
    assert ranks[0]["switched_at_call"] == ranks[1]["switched_at_call"] == half + 1
