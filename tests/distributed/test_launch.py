"""The example script under torchrun and the deepspeed launcher, configured only by the
environment or a YAML file: the configuration must reach every rank. Two machines are simulated
by two launchers on this one, one process each, meeting through the launchers' rendezvous."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from launching import describe, free_port, launch, launch_nodes, read_ranks, torchrun

pytestmark = pytest.mark.distributed

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "distributed_train.py"
PLAIN_KEYS = 21  # llama(depth=2): embeddings, 2 x 9 block tensors, final norm, lm_head


DEEPSPEED = Path(sys.executable).parent / "deepspeed"
needs_deepspeed_launcher = pytest.mark.skipif(
    shutil.which("deepspeed", path=str(DEEPSPEED.parent)) is None,
    reason="DeepSpeed's launcher is not installed",
)


def deepspeed_setup(tmp_path: Path, zero_stage: int) -> Path:
    """A DeepSpeed JSON config and the torchkiln YAML that points at it; returns the YAML."""
    (tmp_path / "ds_config.json").write_text(
        json.dumps(
            {
                "train_micro_batch_size_per_gpu": 2,
                "zero_optimization": {"stage": zero_stage},
                "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
            }
        )
    )
    config = tmp_path / "train.yaml"
    config.write_text(
        "backend: aot_eager\n"
        "distributed:\n"
        "  strategy: deepspeed\n"
        f"  deepspeed:\n    config: {tmp_path / 'ds_config.json'}\n"
    )
    return config


def run_example(tmp_path: Path, env: dict[str, str] | None = None) -> list[dict]:
    out = tmp_path / "out"
    out.mkdir()
    process = torchrun(EXAMPLE, ["--json", str(out)], cwd=tmp_path, env=env)
    return read_ranks(out, process)


def test_environment_reaches_every_rank_under_torchrun(tmp_path):
    ranks = run_example(
        tmp_path, env={"TORCHKILN_DISTRIBUTED_STRATEGY": "ddp", "TORCHKILN_BACKEND": "aot_eager"}
    )
    assert [r["rank"] for r in ranks] == [0, 1]
    for data in ranks:
        assert data["world_size"] == 2
        assert data["returned"] == "DistributedDataParallel"
        assert data["plain_module"] == "LlamaForCausalLM"
        assert data["backend"] == "aot_eager"
        assert data["regions_compiled"] == data["regions"] == 2
    assert [r["state_dict_keys"] for r in ranks] == [PLAIN_KEYS, 0]


def test_yaml_in_working_directory_reaches_every_rank(tmp_path):
    (tmp_path / "torchkiln.yaml").write_text(
        "backend: aot_eager\n"
        "distributed:\n"
        "  strategy: fsdp2\n"
        "  fsdp2:\n"
        "    reshard_after_forward: true\n"
    )
    ranks = run_example(tmp_path)
    for data in ranks:
        assert data["returned"] == "FSDPLlamaForCausalLM"  # fully_shard's class, same object
        assert data["plain_module"] == "FSDPLlamaForCausalLM"
        assert data["backend"] == "aot_eager"
        assert data["regions_compiled"] == 2
    assert ranks[0]["losses"] != ranks[1]["losses"]  # each rank trained on its own data
    assert [r["state_dict_keys"] for r in ranks] == [PLAIN_KEYS, 0]


@needs_deepspeed_launcher
def test_deepspeed_launcher_with_yaml_from_environment(tmp_path):
    config = deepspeed_setup(tmp_path, zero_stage=2)
    out = tmp_path / "out"
    out.mkdir()

    def command() -> list[str]:
        return [
            str(DEEPSPEED),
            "--num_gpus=2",
            f"--master_port={free_port()}",
            str(EXAMPLE),
            "--json",
            str(out),
        ]

    process = launch(command, cwd=tmp_path, env={"TORCHKILN_CONFIG": str(config)})
    assert process.returncode == 0, describe(process)
    ranks = read_ranks(out, process)
    for data in ranks:
        assert data["returned"] == "DeepSpeedEngine"
        assert data["plain_module"] == "LlamaForCausalLM"
        assert data["regions_compiled"] == 2
    assert [r["state_dict_keys"] for r in ranks] == [PLAIN_KEYS, 0]


def test_two_machines_under_torchrun_rendezvous(tmp_path):
    out = tmp_path / "out"
    out.mkdir()

    def nodes() -> list[list[str]]:
        endpoint = f"127.0.0.1:{free_port()}"
        return [
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc_per_node=1",
                f"--node_rank={node}",
                "--rdzv_backend=c10d",
                f"--rdzv_endpoint={endpoint}",
                "--rdzv_id=torchkiln-test",
                str(EXAMPLE),
                "--json",
                str(out),
            ]
            for node in (0, 1)
        ]

    process = launch_nodes(
        nodes,
        cwd=tmp_path,
        env={"TORCHKILN_DISTRIBUTED_STRATEGY": "ddp", "TORCHKILN_BACKEND": "aot_eager"},
    )
    ranks = read_ranks(out, process)
    assert [(r["rank"], r["world_size"]) for r in ranks] == [(0, 2), (1, 2)]
    for data in ranks:
        assert data["returned"] == "DistributedDataParallel"
        assert data["backend"] == "aot_eager"
        assert data["regions_compiled"] == data["regions"] == 2
    assert [r["state_dict_keys"] for r in ranks] == [PLAIN_KEYS, 0]


@needs_deepspeed_launcher
def test_two_machines_under_the_deepspeed_launcher_without_ssh(tmp_path):
    # A hostfile names the machines; --no_ssh starts the launcher on each one by hand (here,
    # twice on this machine), each with its --node_rank.
    (tmp_path / "hostfile").write_text("node0 slots=1\nnode1 slots=1\n")
    config = deepspeed_setup(tmp_path, zero_stage=1)
    out = tmp_path / "out"
    out.mkdir()

    def nodes() -> list[list[str]]:
        port = free_port()
        return [
            [
                str(DEEPSPEED),
                f"--hostfile={tmp_path / 'hostfile'}",
                "--no_ssh",
                f"--node_rank={node}",
                "--master_addr=127.0.0.1",
                f"--master_port={port}",
                str(EXAMPLE),
                "--json",
                str(out),
            ]
            for node in (0, 1)
        ]

    process = launch_nodes(nodes, cwd=tmp_path, env={"TORCHKILN_CONFIG": str(config)})
    ranks = read_ranks(out, process)
    assert [(r["rank"], r["world_size"]) for r in ranks] == [(0, 2), (1, 2)]
    for data in ranks:
        assert data["returned"] == "DeepSpeedEngine"
        assert data["plain_module"] == "LlamaForCausalLM"
        assert data["regions_compiled"] == 2
    assert ranks[0]["losses"] != ranks[1]["losses"]
    assert [r["state_dict_keys"] for r in ranks] == [PLAIN_KEYS, 0]
