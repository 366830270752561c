"""``torchkiln.integrations.lightning``: a real ``Trainer.fit`` on CPU compiles the module
region by region, trains like eager, and saves checkpoints that load into a plain module."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")
pytest.importorskip("transformers")

from lightning_models import LitLlama, eval_ids, token_batches, weight_sum  # noqa: E402

import torchkiln  # noqa: E402
from torchkiln.integrations.lightning import TorchkilnCallback  # noqa: E402

STEPS = 3


def fit(module: LitLlama, root: Path, callbacks: list[object]) -> pl.Trainer:
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=STEPS,
        callbacks=callbacks,
        default_root_dir=root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, token_batches())
    return trainer


@pytest.mark.slow
def test_fit_compiles_regions_trains_like_eager_and_checkpoints_load_plainly(
    tmp_path: Path,
) -> None:
    eager = LitLlama()
    fit(eager, tmp_path / "eager", [])

    module = LitLlama()
    layer = module.model.model.layers[0]
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    trainer = fit(module, tmp_path / "kiln", [TorchkilnCallback(backend="eager"), checkpoint])

    assert torchkiln.is_compiled(module)
    assert module.model.model.layers[0] is layer and type(layer).__name__ == "LlamaDecoderLayer"
    regions = torchkiln.report(module).to_dict()["regions"]
    assert [(r["path"], r["status"]) for r in regions] == [
        ("model.model.layers.0", "compiled"),
        ("model.model.layers.1", "compiled"),
    ]
    # The same steps as eager (the eager backend runs the same kernels).
    assert trainer.global_step == STEPS
    torch.testing.assert_close(module.losses, eager.losses, rtol=1e-5, atol=1e-5)
    assert weight_sum(module) == pytest.approx(weight_sum(eager), rel=1e-6)

    saved = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    assert not any("_orig_mod" in key for key in saved["state_dict"])
    plain = LitLlama(seed=1)
    plain.load_state_dict(saved["state_dict"], strict=True)
    with torch.no_grad():
        torch.testing.assert_close(plain(eval_ids()), module(eval_ids()))
    restored = LitLlama.load_from_checkpoint(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    assert not torchkiln.is_compiled(restored)


def test_callback_refuses_a_distributed_strategy_of_its_own() -> None:
    with pytest.raises(torchkiln.ConfigError, match="Lightning's own settings"):
        TorchkilnCallback(distributed="ddp")
