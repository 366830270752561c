"""``install()`` under a real ``accelerate launch`` with 2 CPU processes (DDP over gloo):
Accelerate's regional compile path, from the launcher's own flags, runs on torchkiln."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest

HERE = Path(__file__).parent


@pytest.mark.distributed
def test_install_under_accelerate_launch_matches_accelerates_own_training(
    tmp_path: Path, launching: ModuleType
) -> None:
    pytest.importorskip("accelerate")

    def command() -> list[str]:
        return [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--multi_gpu",  # with Accelerator(cpu=True): MULTI_CPU, gloo
            "--num_processes=2",
            "--num_machines=1",
            "--mixed_precision=no",
            "--dynamo_backend=eager",
            "--dynamo_use_regional_compilation",
            "--main_process_ip=127.0.0.1",
            f"--main_process_port={launching.free_port()}",
            str(HERE / "accelerate_training.py"),
            str(tmp_path),
        ]

    # HF_HOME: no accelerate config file of the machine's takes part.
    process = launching.launch(command, cwd=tmp_path, env={"HF_HOME": str(tmp_path / "hf")})
    ranks = launching.read_ranks(tmp_path, process)
    for rank in ranks:
        assert rank["distributed_type"] == "DistributedType.MULTI_CPU"
        assert rank["dynamo"]["backend"] == "eager"
        assert rank["dynamo"]["use_regional_compilation"] is True
        ours, theirs = rank["torchkiln"], rank["accelerate"]
        assert ours["prepared_type"] == "DistributedDataParallel"
        assert ours["unwrapped_type"] == "LlamaForCausalLM"
        assert ours["block_classes"] == ["LlamaDecoderLayer"]
        assert ours["orig_mod_keys"] == []
        assert ours["state_dict_load"] == {"ok": True, "same_logits": True}
        assert ours["save_model_load"] == {"ok": True, "same_logits": True}
        assert [status for _, status in ours["regions"]] == ["compiled"] * 5
        # Accelerate's own training step, to the float; its checkpoint keys have _orig_mod.
        assert ours["losses"] == pytest.approx(theirs["losses"], rel=1e-6)
        assert ours["weight_sum"] == pytest.approx(theirs["weight_sum"], rel=1e-9)
        assert len(theirs["orig_mod_keys"]) == 21
    # Different batches per rank, one set of weights: DDP synchronised the compiled model.
    assert ranks[0]["torchkiln"]["losses"] != ranks[1]["torchkiln"]["losses"]
    assert ranks[0]["torchkiln"]["weight_sum"] == ranks[1]["torchkiln"]["weight_sum"]
