"""Porting script: a regressor with two parameter groups and ReduceLROnPlateau on ``val_loss``.

Covers: an LR-scheduler dict with ``monitor``, several param groups, ``LearningRateMonitor``,
``self.log`` with ``on_step``+``on_epoch`` and ``sync_dist``, logging in ``on_train_epoch_end``
and ``on_validation_epoch_end``, ``num_sanity_val_steps``, ``log_every_n_steps``,
``self.hparams.x`` after ``save_hyperparameters()``, ``self.optimizers()``,
``self.current_epoch``, ``trainer.logged_metrics``, ``seed_everything(workers=True)``,
``trainer.save_checkpoint``, ``num_nodes``, ``trainer.is_global_zero``; checked against the same training in one plain-PyTorch process.

    PORT_FRAMEWORK=fullshard python tests/porting/plateau_param_groups.py --strategy fsdp --out /tmp/p1
    PORT_FRAMEWORK=lightning python tests/porting/plateau_param_groups.py --strategy ddp --out /tmp/p1
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from recording import RECORD, RecordCallbackHooks, RecordModuleHooks, check, close, mark, run, snapshot, value
from reference import global_batches, mean_loss, state_close
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FRAMEWORK = os.environ.get("PORT_FRAMEWORK", "fullshard")
if FRAMEWORK == "lightning":
    import lightning.pytorch as L
    from lightning.pytorch.callbacks import Callback, LearningRateMonitor
    from lightning.pytorch.loggers import CSVLogger
else:
    import fullshard as L
    from fullshard.callbacks import Callback, LearningRateMonitor
    from fullshard.loggers import CSVLogger

SEED, EPOCHS, BATCH = 42, 3, 8


def make_data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = torch.sin(x.sum(-1)) + 0.1 * torch.randn(n, generator=g)
    return TensorDataset(x, y)


def make_optimizer(model):
    optimizer = torch.optim.SGD(
        [
            {"params": model.body.parameters(), "lr": model.hparams.lr},
            {"params": model.head.parameters(), "lr": model.hparams.head_lr},
        ],
        momentum=0.9,
    )
    # threshold=10 (absolute): no epoch after the first counts as an improvement, so the LRs
    # halve after every epoch from the second on: a schedule we can check exactly.
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
        optimizer, mode="min", factor=0.5, patience=0, threshold=10.0, threshold_mode="abs"
    )
    return optimizer, scheduler


class Regressor(RecordModuleHooks, L.LightningModule):
    def __init__(self, hidden: int = 16, lr: float = 0.1, head_lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.body = nn.Sequential(nn.Linear(4, hidden), nn.Tanh())
        self.head = nn.Linear(hidden, 1)

    def forward(self, x):
        return self.head(self.body(x)).squeeze(-1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("val_loss", loss, sync_dist=True)
        self.log("val_mae", (self(x) - y).abs().mean(), on_epoch=True, sync_dist=True, prog_bar=True)

    def on_validation_epoch_end(self):
        self.log("val_epoch", float(self.current_epoch))

    def on_train_epoch_end(self):
        groups = self.optimizers().param_groups
        value(f"lrs_epoch{self.current_epoch}", [g["lr"] for g in groups])
        self.log("head_lr", groups[1]["lr"])

    def configure_optimizers(self):
        optimizer, scheduler = make_optimizer(self)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {
                "scheduler": scheduler,
                "monitor": "val_loss",
                "interval": "epoch",
                "frequency": 1,
            },
        }


class Recorder(RecordCallbackHooks, Callback):
    def on_train_epoch_end(self, trainer, pl_module):
        snapshot("on_train_epoch_end", trainer)

    def on_validation_end(self, trainer, pl_module):
        snapshot("on_validation_end", trainer)


def reference(train: TensorDataset, val: TensorDataset, world_size: int) -> tuple[dict, list[float], float]:
    """The same training in one process: weights, last epoch's mean training loss, final val loss."""
    torch.manual_seed(SEED)
    model = Regressor()
    optimizer, plateau = make_optimizer(model)
    x, y = train.tensors
    epoch_loss = 0.0
    for epoch in range(EPOCHS):
        losses = []
        for idx in global_batches(len(train), BATCH, world_size, shuffle=True, seed=SEED, epoch=epoch):
            loss = F.mse_loss(model(x[idx]), y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(float(loss))
        epoch_loss = sum(losses) / len(losses)
        plateau.step(mean_loss(model, F.mse_loss, val.tensors))
    return model.state_dict(), epoch_loss, mean_loss(model, F.mse_loss, val.tensors)


def main(args):
    L.seed_everything(SEED, workers=True)
    root = args.out / "work"
    train, val = make_data(64, 1), make_data(32, 2)
    model = Regressor()
    check("hparams", model.hparams.hidden == 16 and model.hparams.lr == 0.1, dict(model.hparams))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        num_nodes=1,
        strategy=args.strategy,
        max_epochs=EPOCHS,
        num_sanity_val_steps=1,
        log_every_n_steps=2,
        logger=CSVLogger(root, name="logs"),
        callbacks=[Recorder(), LearningRateMonitor(logging_interval="epoch")],
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=root,
    )
    mark("fit")
    trainer.fit(model, DataLoader(train, batch_size=BATCH, shuffle=True), DataLoader(val, batch_size=BATCH))
    mark("after fit")
    snapshot("after fit", trainer)
    value("global_step", trainer.global_step)
    value("current_epoch", trainer.current_epoch)
    logged = trainer.logged_metrics
    value("logged_metric_names", sorted(logged))
    trainer.save_checkpoint(root / "final.ckpt")

    if trainer.is_global_zero:
        weights, last_epoch_loss, val_loss = reference(train, val, trainer.world_size)
        saved = torch.load(root / "final.ckpt", map_location="cpu", weights_only=False)["state_dict"]
        check("final weights equal one-process training", *state_close(saved, weights))
        check(
            "val_loss is the final weights' loss on the whole validation set",
            close(trainer.callback_metrics["val_loss"], val_loss),
            (float(trainer.callback_metrics["val_loss"]), val_loss),
        )
        check(
            "train_loss_epoch is the mean loss of the last epoch",
            close(logged.get("train_loss_epoch", float("nan")), last_epoch_loss),
            (logged.get("train_loss_epoch"), last_epoch_loss),
        )
    base = (0.1, 0.05)
    expected = [[lr * 0.5 ** max(0, e - 1) for lr in base] for e in range(EPOCHS)]
    seen = [RECORD.values.get(f"lrs_epoch{e}") for e in range(EPOCHS)]
    check(
        "plateau halves both groups' LRs after every epoch from the second",
        close(seen, expected) if None not in seen else False,
        seen,
    )


if __name__ == "__main__":
    run(main)
