"""Validate one fixed model on N processes and write the logged val_loss (batch-size weighting).

python tests/scripts/val_weighting.py --out DIR --devices 3 --strategy ddp
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import fullshard


def make_data(n: int = 60) -> TensorDataset:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, (x**2).sum(-1) + torch.randn(n, generator=g))


class Fixed(fullshard.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 1)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.mse_loss(self.layer(x).squeeze(-1), y), sync_dist=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--strategy", default="ddp")
    args = p.parse_args()
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=args.strategy if args.devices > 1 else "auto",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    # batches of 7: 8 full + 4 on one process, 4 full + 2 on two, 2 full + 6 on three
    result = trainer.validate(Fixed(), DataLoader(make_data(), batch_size=7), verbose=False)
    if trainer.is_global_zero:
        Path(args.out).write_text(json.dumps(result[0]))


if __name__ == "__main__":
    main()
