"""Real 2-process runs on CPU (gloo): Lightning DDP with ``TorchkilnCallback`` (torchrun)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

HERE = Path(__file__).parent


@pytest.mark.distributed
def test_lightning_ddp_trains_compiled_blocks_in_sync(
    tmp_path: Path, launching: ModuleType
) -> None:
    pytest.importorskip("lightning.pytorch")
    process = launching.torchrun(HERE / "lightning_ddp.py", [str(tmp_path)], cwd=tmp_path)
    ranks = launching.read_ranks(tmp_path, process)
    for rank in ranks:
        assert rank["world_size"] == 2 and rank["wrapper"] == "DistributedDataParallel"
        assert rank["block_class"] == "LlamaDecoderLayer"
        assert rank["regions"] == [
            ["model.model.layers.0", "compiled"],
            ["model.model.layers.1", "compiled"],
        ]
    # Each rank saw its own batches, and DDP kept the weights identical.
    assert ranks[0]["losses"] != ranks[1]["losses"]
    assert ranks[0]["weight_sum"] == ranks[1]["weight_sum"]
    assert ranks[0]["plain_equals_trained"] is True and ranks[0]["orig_mod_keys"] == []
