"""Train a fixed classifier (lr=0) with torchmetrics logged in training, validation (two
dataloaders) and test, on N processes; rank 0 writes what was logged as JSON.

python tests/scripts/torchmetrics_job.py --out FILE --devices 2 --strategy fsdp
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import torchmetrics
from torch.utils.data import DataLoader, TensorDataset

import fullshard
from fullshard.callbacks import Callback
from fullshard.strategies import FSDP2Strategy


def make_data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, torch.randint(0, 3, (n,), generator=g))


class Classifier(fullshard.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 3)
        self.train_acc = torchmetrics.Accuracy(task="multiclass", num_classes=3)
        self.val_acc = torch.nn.ModuleList(
            torchmetrics.Accuracy(task="multiclass", num_classes=3) for _ in range(2)
        )
        self.test_metrics = torchmetrics.MetricCollection(
            {
                "acc": torchmetrics.Accuracy(task="multiclass", num_classes=3),
                "f1": torchmetrics.F1Score(task="multiclass", num_classes=3, average="macro"),
            },
            prefix="test_",
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self.layer(x)
        self.train_acc(logits, y)
        self.log("train_acc", self.train_acc, on_step=True, on_epoch=True, metric_attribute="train_acc")
        return F.cross_entropy(logits, y)

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        x, y = batch
        metric = self.val_acc[dataloader_idx]
        metric(self.layer(x), y)
        self.log("val_acc", metric)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.test_metrics(self.layer(x), y)
        self.log_dict(self.test_metrics)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.0)


class Record(Callback):
    def __init__(self) -> None:
        self.epochs: list[dict[str, float]] = []
        self.counts_at_start: list[int] = []

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        # the Trainer resets a logged metric after each epoch: it starts empty every time
        self.counts_at_start.append(pl_module.train_acc.update_count + pl_module.val_acc[0].update_count)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.epochs.append({k: float(v) for k, v in trainer.callback_metrics.items()})


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--strategy", default="ddp")
    args = p.parse_args()
    strategy: Any = FSDP2Strategy() if args.strategy == "fsdp2" else args.strategy
    record = Record()
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=strategy if args.devices > 1 else "auto",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        max_epochs=2,
        num_sanity_val_steps=0,
        callbacks=[record],
    )
    model = Classifier()
    val = [DataLoader(make_data(24, 2), batch_size=4), DataLoader(make_data(16, 3), batch_size=4)]
    trainer.fit(model, DataLoader(make_data(32, 1), batch_size=4), val)
    fit_metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    tested = trainer.test(model, DataLoader(make_data(20, 4), batch_size=5), verbose=False)
    if trainer.is_global_zero:
        Path(args.out).write_text(
            json.dumps(
                {
                    "counts": record.counts_at_start,
                    "epochs": record.epochs,
                    "fit": fit_metrics,
                    "test": tested,
                }
            )
        )


if __name__ == "__main__":
    main()
