"""Warnings in a 2-process job: start-up ones once, rank-specific ones from their rank.

python tests/scripts/launch_warnings.py
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

import fullshard

warnings.warn("warned while the script starts", stacklevel=1)


class Tiny(fullshard.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if batch_idx == 0:
            warnings.warn(f"rank {self.global_rank} warns in training_step", stacklevel=1)
        return self.layer(batch[0]).sum()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    trainer = fullshard.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_steps=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Tiny(), DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2))
    print(f"rank {os.environ.get('LOCAL_RANK', '0')} done")
