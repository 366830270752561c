"""Lightning DDP on CPU with ``TorchkilnCallback``, run by ``torchrun --nproc_per_node=2``:

    python -m torch.distributed.run --nproc_per_node=2 lightning_ddp.py OUT_DIR

writes ``OUT_DIR/rank<N>.json`` (or ``{"error": ...}``)."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning_models import LitLlama, eval_ids, token_batches, weight_sum

import torchkiln
from torchkiln.integrations.lightning import TorchkilnCallback

STEPS = 2


class RecordWrapper(pl.Callback):
    """What wraps the module while it trains (Lightning unwraps it again at teardown)."""

    wrapper = ""

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.wrapper = type(trainer.strategy.model).__name__


def run(out_dir: Path) -> tuple[int, dict[str, Any]]:
    module = LitLlama()
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=out_dir / "ckpt", save_last=True)
    record = RecordWrapper()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=STEPS,
        callbacks=[TorchkilnCallback(backend="eager"), checkpoint, record],
        default_root_dir=out_dir,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, token_batches())
    result: dict[str, Any] = {
        "world_size": trainer.world_size,
        "wrapper": record.wrapper,
        "block_class": type(module.model.model.layers[0]).__name__,
        "regions": [
            [r["path"], r["status"]] for r in torchkiln.report(module).to_dict()["regions"]
        ],
        "losses": module.losses,
        "weight_sum": weight_sum(module),
    }
    trainer.strategy.barrier()
    if trainer.global_rank == 0:
        saved = torch.load(out_dir / "ckpt" / "last.ckpt", weights_only=True)
        plain = LitLlama(seed=1)
        plain.load_state_dict(saved["state_dict"], strict=True)
        with torch.no_grad():
            result["plain_equals_trained"] = bool(
                torch.allclose(plain(eval_ids()), module(eval_ids()), atol=1e-5)
            )
        result["orig_mod_keys"] = [k for k in saved["state_dict"] if "_orig_mod" in k]
    return trainer.global_rank, result


def main(out_dir: Path) -> None:
    import os

    rank = int(os.environ.get("RANK", "0"))
    try:
        rank, result = run(out_dir)
    except Exception:
        result = {"error": traceback.format_exc()}
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
