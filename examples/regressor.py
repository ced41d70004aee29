"""A complete fullshard training script: a small regressor on synthetic data.

python examples/regressor.py                 # 2 CPU processes with DDP
python examples/regressor.py --devices 1     # one process
python examples/regressor.py --resume last   # continue from the newest checkpoint
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset, random_split

import fullshard


class Regressor(fullshard.Module):
    def __init__(self, hidden: int = 64, lr: float = 1e-2) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self.net(x).squeeze(-1), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.mse_loss(self.net(x).squeeze(-1), y), prog_bar=True, sync_dist=True)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams["lr"])
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=100)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--max-epochs", type=int, default=5)
    parser.add_argument("--root-dir", default="regressor_run")
    parser.add_argument("--resume", default=None, help="a checkpoint path, or 'last'")
    args = parser.parse_args()

    fullshard.seed_everything(0)
    x = torch.randn(2048, 8)
    y = x @ torch.linspace(-1, 1, 8) + 0.05 * torch.randn(2048)
    train, val = random_split(TensorDataset(x, y), [1792, 256], generator=torch.Generator().manual_seed(0))

    # a fixed folder, so that a later run finds "last" there (by default checkpoints go into the
    # logger's folder of this run: <root>/lightning_logs/version_N/checkpoints, as in Lightning)
    checkpoints = fullshard.ModelCheckpoint(
        dirpath=Path(args.root_dir) / "checkpoints",
        monitor="val_loss",
        mode="min",
        save_top_k=2,
        save_last=True,
    )
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=args.devices,
        max_epochs=args.max_epochs,
        callbacks=[checkpoints],
        default_root_dir=args.root_dir,
        log_every_n_steps=10,
    )
    trainer.fit(
        Regressor(),
        DataLoader(train, batch_size=64, shuffle=True),
        DataLoader(val, batch_size=128),
        ckpt_path=args.resume,
    )
    trainer.print(
        f"best checkpoint: {checkpoints.best_model_path} (val_loss {checkpoints.best_model_score:.4f})"
    )


if __name__ == "__main__":
    main()
