"""A 2-process fit whose configure_optimizers returns None.

python tests/scripts/launch_bad_optimizer.py
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

import fullshard


class NoOptimizer(fullshard.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).sum()

    def configure_optimizers(self) -> Any:
        return None


if __name__ == "__main__":
    trainer = fullshard.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", logger=False, enable_progress_bar=False
    )
    trainer.fit(NoOptimizer(), DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2))
