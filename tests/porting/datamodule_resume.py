"""Porting script: a DataModule, training stopped after 2 epochs and resumed from "last" to 4.

Covers: ``LightningDataModule`` (``prepare_data``, ``setup(stage)``, dataloader methods,
``save_hyperparameters``, ``state_dict`` / ``load_state_dict``), ``fit(datamodule=)``, ``validate(datamodule=)``,
``ModelCheckpoint(save_last=True)`` and ``last_model_path``, ``fit(ckpt_path="last")`` restoring
weights, SGD momentum, an epoch ``StepLR``, loop counters and callback state,
``on_save_checkpoint`` / ``on_load_checkpoint`` custom entries, ``Module.load_from_checkpoint``,
``self.hparams``, ``seed_everything(workers=True)``, ``deterministic=True``; checked against an uninterrupted 4-epoch run
in one plain-PyTorch process.

    PORT_FRAMEWORK=fullshard python tests/porting/datamodule_resume.py --strategy fsdp --out /tmp/p4
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn.functional as F
from recording import (
    RecordCallbackHooks,
    RecordDataModuleHooks,
    RecordModuleHooks,
    check,
    close,
    mark,
    run,
    snapshot,
    value,
)
from reference import global_batches, mean_loss, state_close
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FRAMEWORK = os.environ.get("PORT_FRAMEWORK", "fullshard")
if FRAMEWORK == "lightning":
    import lightning.pytorch as L
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint
else:
    import fullshard as L
    from fullshard.callbacks import Callback, ModelCheckpoint

SEED, BATCH, FIRST_EPOCHS, EPOCHS = 11, 8, 2, 4


def make_data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=g)
    y = x @ torch.linspace(-1, 1, 5) + 0.2 * torch.randn(n, generator=g)
    return TensorDataset(x, y)


class Data(RecordDataModuleHooks, L.LightningDataModule):
    def __init__(self, root: str, batch_size: int = BATCH) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.train_set: TensorDataset | None = None
        self.val_set: TensorDataset | None = None
        self.setups = 0

    def prepare_data(self):
        # "download" once per machine: write the data files (no state is set here)
        Path(self.hparams.root).mkdir(parents=True, exist_ok=True)
        torch.save(make_data(48, 1).tensors, Path(self.hparams.root) / "train.pt")
        torch.save(make_data(32, 2).tensors, Path(self.hparams.root) / "val.pt")

    def setup(self, stage):
        self.setups += 1
        self.train_set = TensorDataset(*torch.load(Path(self.hparams.root) / "train.pt"))
        self.val_set = TensorDataset(*torch.load(Path(self.hparams.root) / "val.pt"))

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size)

    def state_dict(self):
        return {"setups": self.setups}

    def load_state_dict(self, state_dict):
        self.setups = state_dict["setups"]


class Linear(RecordModuleHooks, L.LightningModule):
    def __init__(self, lr: float = 0.05, gamma: float = 0.7) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = nn.Linear(5, 1)
        self.loaded_note = None

    def forward(self, x):
        return self.layer(x).squeeze(-1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y), sync_dist=True)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        return {
            "optimizer": optimizer,
            "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, self.hparams.gamma),
        }

    def on_save_checkpoint(self, checkpoint):
        checkpoint["note"] = {"saved_at_epoch": self.current_epoch}

    def on_load_checkpoint(self, checkpoint):
        self.loaded_note = checkpoint.get("note")


class PartialLinear(Linear):
    """Loads a checkpoint that holds part of its weights, the rest keeping their own values."""

    strict_loading = False


class Recorder(RecordCallbackHooks, Callback):
    def __init__(self) -> None:
        self.batches = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.batches += 1

    def on_validation_end(self, trainer, pl_module):
        snapshot("on_validation_end", trainer)

    def state_dict(self):
        return {"batches": self.batches}

    def load_state_dict(self, state_dict):
        self.batches = state_dict["batches"]


def reference(train: TensorDataset, world_size: int) -> dict:
    """4 uninterrupted epochs in one process."""
    torch.manual_seed(SEED)
    model = Linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.7)
    x, y = train.tensors
    for epoch in range(EPOCHS):
        for idx in global_batches(len(train), BATCH, world_size, shuffle=True, seed=SEED, epoch=epoch):
            optimizer.zero_grad()
            F.mse_loss(model(x[idx]), y[idx]).backward()
            optimizer.step()
        scheduler.step()
    return model.state_dict()


def make_trainer(args, root: Path, epochs: int, recorder: Recorder):
    checkpoint = ModelCheckpoint(dirpath=root / "ckpts", save_last=True, save_top_k=-1)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=args.strategy,
        max_epochs=epochs,
        deterministic=True,
        callbacks=[recorder, checkpoint],
        logger=False,
        enable_progress_bar=False,
        default_root_dir=root,
    )
    return trainer, checkpoint


def main(args):
    L.seed_everything(SEED, workers=True)
    root: Path = args.out / "work"
    data = Data(str(root / "data"))

    first_recorder = Recorder()
    trainer, _ = make_trainer(args, root, FIRST_EPOCHS, first_recorder)
    mark("fit 2 epochs")
    trainer.fit(Linear(), datamodule=data)
    mark("after first fit")
    value("first_recorder_batches", first_recorder.batches)

    recorder = Recorder()
    trainer, checkpoint = make_trainer(args, root, EPOCHS, recorder)
    model = Linear()
    mark("resume from last")
    trainer.fit(model, datamodule=data, ckpt_path="last")
    mark("after resumed fit")
    value("current_epoch", trainer.current_epoch)
    value("global_step", trainer.global_step)
    value("recorder_batches", recorder.batches)
    value("loaded_note", model.loaded_note)
    value("last_model_path", Path(checkpoint.last_model_path).name)
    value("datamodule_setups", data.setups)
    check("the callback's state was restored and went on", recorder.batches == EPOCHS * 3, recorder.batches)
    check(
        "on_load_checkpoint saw the entry on_save_checkpoint added",
        model.loaded_note == {"saved_at_epoch": FIRST_EPOCHS - 1},
        model.loaded_note,
    )

    mark("validate")
    results = trainer.validate(model, datamodule=data)
    mark("after validate")
    value("validate_results", results)

    restored = Linear.load_from_checkpoint(checkpoint.last_model_path)
    check(
        "load_from_checkpoint keeps the hyperparameters",
        restored.hparams.gamma == 0.7,
        dict(restored.hparams),
    )
    weights = reference(data.train_set, trainer.world_size)
    check(
        "resumed weights equal 4 uninterrupted epochs in one process",
        *state_close(restored.state_dict(), weights),
    )
    expected = mean_loss(restored, F.mse_loss, data.val_set.tensors)
    check(
        "validate() gives the final weights' loss on the whole validation set",
        close(results[0]["val_loss"], expected),
        (results[0], expected),
    )

    # what a save hook removes is not written: a checkpoint of the bias only (as a fine-tune keeps
    # only its adapter), loaded into a whole module through strict_loading = False
    def keep_bias_only(checkpoint):
        Linear.on_save_checkpoint(model, checkpoint)
        for key in [k for k in checkpoint["state_dict"] if not k.endswith("bias")]:
            del checkpoint["state_dict"][key]

    model.on_save_checkpoint = keep_bias_only
    trainer.save_checkpoint(root / "bias_only.ckpt")
    partial = PartialLinear.load_from_checkpoint(root / "bias_only.ckpt")
    trained = restored.state_dict()  # the final weights, whole (under FSDP the model holds shards)
    check(
        "a checkpoint a hook cut down to the bias loads with strict_loading=False",
        partial.strict_loading is False
        and torch.equal(partial.layer.bias, trained["layer.bias"])
        and not torch.equal(partial.layer.weight, trained["layer.weight"]),
        (partial.state_dict(), trained),
    )


if __name__ == "__main__":
    run(main)
