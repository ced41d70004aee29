"""The model summary of a 2-process sharded run: FSDP1 (with and without use_orig_params), then FSDP2.

python tests/scripts/summary_job.py
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import fullshard
import fullshard.callbacks
from fullshard.strategies import FSDP2Strategy, FSDPStrategy


class ThreeLayers(fullshard.Module):
    """930 + 930 (frozen) + 31 = 1891 parameters, each Linear its own FSDP unit."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(30, 30)
        self.b = nn.Linear(30, 30)
        self.c = nn.Linear(30, 1)
        self.b.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(self.b(self.a(x)))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch[0]).sum()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.1)


if __name__ == "__main__":
    strategies = [
        ("fsdp", FSDPStrategy(auto_wrap_policy={nn.Linear})),
        ("fsdp, use_orig_params=False", FSDPStrategy(auto_wrap_policy={nn.Linear}, use_orig_params=False)),
        ("fsdp2", FSDP2Strategy(auto_wrap_policy={nn.Linear})),
    ]
    for name, strategy in strategies:
        trainer = fullshard.Trainer(
            accelerator="cpu", devices=2, strategy=strategy, max_steps=1, logger=False,
            enable_checkpointing=False, enable_progress_bar=False,
            callbacks=[fullshard.callbacks.ModelSummary()],  # the text table (the default is rich's with rich)
        )  # fmt: skip
        if trainer.is_global_zero:
            print(f"=== {name}", file=sys.stderr, flush=True)  # where the summary goes (logging)
        trainer.fit(ThreeLayers(), DataLoader(TensorDataset(torch.randn(4, 30)), batch_size=2))
