"""A LightningCLI training script for tests/test_cli_config.py, runnable under fullshard or (with
PORT_FRAMEWORK=lightning) under Lightning:

    python tests/scripts/cli_train.py fit --config run.yaml --trainer.strategy fsdp --trainer.devices 2
    PORT_FRAMEWORK=lightning /tmp/lvenv/bin/python tests/scripts/cli_train.py fit --print_config

``after_fit``/``after_test`` write ``<default_root_dir>/rank<N>-<stage>.json`` (step, parameter
sum, metrics) when ``CLI_TRAIN_REPORT`` is set, so a test can see what every process did.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

if os.environ.get("PORT_FRAMEWORK") == "lightning":
    import lightning.pytorch as L
    from lightning.pytorch.cli import LightningCLI
else:
    import fullshard as L
    from fullshard.cli import LightningCLI


class Model(L.LightningModule):
    """Linear regression through a small MLP."""

    def __init__(self, hidden: int = 4, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(3, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y), sync_dist=True)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", F.mse_loss(self(x), y), sync_dist=True)

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class WideModel(Model):
    """A subclass, for ``subclass_mode_model``."""

    def __init__(self, hidden: int = 16, lr: float = 0.05, depth: int = 2) -> None:
        super().__init__(hidden=hidden, lr=lr)
        self.depth = depth


class Data(L.LightningDataModule):
    """Samples of y = x.sum() / 2."""

    def __init__(self, batch_size: int = 4, n: int = 32, seed: int = 0) -> None:
        super().__init__()
        self.batch_size, self.n, self.seed = batch_size, n, seed

    def _data(self, offset: int) -> TensorDataset:
        g = torch.Generator().manual_seed(self.seed + offset)
        x = torch.randn(self.n, 3, generator=g)
        return TensorDataset(x, x.sum(-1, keepdim=True) * 0.5)

    def train_dataloader(self):
        return DataLoader(self._data(0), batch_size=self.batch_size)

    def val_dataloader(self):
        return DataLoader(self._data(1), batch_size=self.batch_size)

    def test_dataloader(self):
        return DataLoader(self._data(2), batch_size=self.batch_size)

    def predict_dataloader(self):
        return DataLoader(self._data(2), batch_size=self.batch_size)


class ReportingCLI(LightningCLI):
    """Writes what each process ended with, for the multi-process test."""

    def _report(self, stage: str) -> None:
        if not os.environ.get("CLI_TRAIN_REPORT"):
            return
        trainer = self.trainer
        root = Path(trainer.default_root_dir)
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        data = {
            "global_step": trainer.global_step,
            "world_size": trainer.world_size,
            "metrics": metrics,
            "strategy": type(trainer.strategy).__name__,
        }
        (root / f"rank{trainer.global_rank}-{stage}.json").write_text(json.dumps(data))

    def after_fit(self) -> None:
        self._report("fit")

    def after_test(self) -> None:
        self._report("test")


if __name__ == "__main__":
    ReportingCLI(Model, Data)
