"""The tuner (``Tuner.lr_find``, ``Tuner.scale_batch_size``) under Lightning 2.6.6 and fullshard
(tests/test_tuner_twins.py compares them).

Run one framework by hand::

    TWIN_FRAMEWORK=lightning /tmp/lvenv/bin/python tests/twins/tuner.py --out /tmp/l.json
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from twin import imp, main

L = imp()
Tuner = imp("tuner").Tuner


def data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return TensorDataset(x, (x[:, :4].sum(1, keepdim=True)).tanh())


class Net(L.LightningModule):
    def __init__(
        self, lr: float = 0.01, batch_size: int = 4, skip_every: int = 0, dropout: float = 0.1
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.lr = lr
        self.batch_size = batch_size
        self.layer = nn.Sequential(nn.Linear(8, 16), nn.Dropout(dropout), nn.ReLU(), nn.Linear(16, 1))
        self.val_losses: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if self.hparams.skip_every and batch_idx % self.hparams.skip_every == 1:
            return None  # a skipped step
        x, y = batch
        return F.mse_loss(self.layer(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.mse_loss(self.layer(x), y))

    def on_validation_epoch_end(self) -> None:
        if not self.trainer.sanity_checking:
            self.val_losses.append(float(self.trainer.callback_metrics["val_loss"]))

    def train_dataloader(self) -> DataLoader:
        # no shuffling: fullshard's sampler draws its order apart from torch's global generator
        return DataLoader(data(256, 1), batch_size=self.batch_size)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(data(64, 2), batch_size=16)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def trainer(tmp: Path, **kwargs: Any) -> Any:
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=tmp,
        **kwargs,
    )


def case_scale_batch_size_leaves_val_dataloaders(tmp: Path) -> Any:
    L.seed_everything(0)
    t = trainer(tmp, max_epochs=1)
    model = Net()
    found = Tuner(t).scale_batch_size(model, max_trials=3, steps_per_trial=2)
    val = t.val_dataloaders
    return {"found": found, "val_set": val is not None, "val_type": type(val).__name__}


def case_lr_find_with_skipped_steps(tmp: Path) -> Any:
    L.seed_everything(0)
    t = trainer(tmp, max_epochs=1)
    model = Net(skip_every=3)
    finder = Tuner(t).lr_find(model, num_training=20, early_stop_threshold=None)
    losses = finder.results["loss"]
    return {
        "points": len(losses),
        "nan": [i for i, v in enumerate(losses) if v != v],
        "lrs": finder.results["lr"][:3],
        "global_step": t.global_step,
    }


def case_lr_find_updates_hparams(tmp: Path) -> Any:
    L.seed_everything(0)
    t = trainer(tmp, max_epochs=1)
    model = Net()
    finder = Tuner(t).lr_find(model, num_training=30)
    return {
        "suggestion": finder.suggestion(),
        "lr": model.lr,
        "hparams_lr": model.hparams.lr,
        "optimizer_lr": t.optimizers[0].param_groups[0]["lr"] if t.optimizers else None,
        "val_set": t.val_dataloaders is not None,
    }


def case_lr_find_after_scale_batch_size(tmp: Path) -> Any:
    # no dropout: fullshard's loaders draw their iterators' seeds from their own generator, not
    # from torch's global one, so random numbers after any epoch differ from Lightning's
    L.seed_everything(7)
    t = trainer(tmp, max_epochs=3)
    model = Net(dropout=0.0)
    tuner = Tuner(t)
    found = tuner.scale_batch_size(model, max_trials=3, steps_per_trial=2)
    finder = tuner.lr_find(model, num_training=30)
    t.fit(model)
    return {"batch_size": found, "suggestion": finder.suggestion(), "val_losses": model.val_losses}


if __name__ == "__main__":
    main()
