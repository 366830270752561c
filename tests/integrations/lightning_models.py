"""A tiny Lightning module around ``LlamaForCausalLM``, shared by the in-process tests and the
2-process DDP script."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from tiny_models import VOCAB, tiny_llama, weight_sum
from torch.utils.data import DataLoader, TensorDataset

__all__ = ["VOCAB", "LitLlama", "eval_ids", "tiny_llama", "token_batches", "weight_sum"]


class LitLlama(pl.LightningModule):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.model = tiny_llama(seed)
        self.losses: list[float] = []

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids).logits

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        (ids,) = batch
        loss = self.model(input_ids=ids, labels=ids).loss
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.5)


def token_batches(samples: int = 8, batch: int = 2, seq: int = 12) -> DataLoader:
    generator = torch.Generator().manual_seed(7)
    ids = torch.randint(0, VOCAB, (samples, seq), generator=generator)
    return DataLoader(TensorDataset(ids), batch_size=batch, shuffle=False)


def eval_ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(3))
