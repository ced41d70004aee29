"""Porting script: a module that brings its own dataloaders, smoke-tested with ``fast_dev_run``,
then evaluated with ``limit_*_batches``.

Covers: ``fast_dev_run`` (a number of batches: no sanity check, no logger, no checkpoints, one
epoch), the module's ``train_dataloader`` / ``val_dataloader`` / ``test_dataloader`` /
``predict_dataloader`` used when nothing is passed, ``fit``/``validate``/``test``/``predict``
without dataloaders, ``limit_val_batches`` / ``limit_test_batches`` / ``limit_predict_batches``,
``trainer.num_val_batches`` / ``num_test_batches`` / ``num_predict_batches``, ``enable_model_summary``,
``inference_mode=False``, ``validation_step`` returning a dict (its
``outputs``), ``self.log(batch_size=)``, ``self.log_dict``; checked against plain PyTorch.

    PORT_FRAMEWORK=fullshard python tests/porting/fast_dev_run.py --strategy fsdp --out /tmp/p5
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from recording import RecordCallbackHooks, RecordModuleHooks, check, close, mark, run, snapshot, value
from reference import rank_indices
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FRAMEWORK = os.environ.get("PORT_FRAMEWORK", "fullshard")
if FRAMEWORK == "lightning":
    import lightning.pytorch as L
    from lightning.pytorch.callbacks import Callback
else:
    import fullshard as L
    from fullshard.callbacks import Callback

SEED, BATCH = 5, 4


def make_data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    return TensorDataset(x, x.sum(-1, keepdim=True) * 0.5)


class Model(RecordModuleHooks, L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(3, 1)
        self.data = {"train": make_data(64, 1), "val": make_data(32, 2), "test": make_data(32, 3)}

    def forward(self, x):
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss, batch_size=len(x))
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log_dict(
            {"val_loss": loss, "val_abs": (self(x) - y).abs().mean()}, sync_dist=True, batch_size=len(x)
        )
        return {"val_loss": loss}

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", F.mse_loss(self(x), y), sync_dist=True)

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(self.data["train"], batch_size=BATCH, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.data["val"], batch_size=BATCH)

    def test_dataloader(self):
        return DataLoader(self.data["test"], batch_size=BATCH)

    def predict_dataloader(self):
        return DataLoader(self.data["test"], batch_size=BATCH)


class Recorder(RecordCallbackHooks, Callback):
    def on_validation_end(self, trainer, pl_module):
        snapshot("on_validation_end", trainer)

    def on_test_end(self, trainer, pl_module):
        snapshot("on_test_end", trainer)


def main(args):
    L.seed_everything(SEED)
    root = args.out / "work"
    model = Model()

    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=args.strategy,
        fast_dev_run=2,
        callbacks=[Recorder()],
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    mark("fast_dev_run fit")
    trainer.fit(model)
    mark("fast_dev_run test")
    trainer.test(model)
    mark("fast_dev_run predict")
    predictions = trainer.predict(model)
    mark("after fast_dev_run")
    value("fast_dev_run_global_step", trainer.global_step)
    value("fast_dev_run_epoch", trainer.current_epoch)
    value("fast_dev_run_predictions", len(predictions))
    value("fast_dev_run_num_val_batches", trainer.num_val_batches)
    check(
        "fast_dev_run wrote no logs and no checkpoints",
        not root.exists() or not any(root.iterdir()),
        sorted(p.name for p in root.iterdir()) if root.exists() else [],
    )

    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=args.strategy,
        limit_val_batches=1,
        limit_test_batches=2,
        limit_predict_batches=3,
        inference_mode=False,
        logger=False,
        callbacks=[Recorder()],
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    mark("validate limit 1")
    val = trainer.validate(model)
    mark("test limit 2")
    test = trainer.test(model)
    mark("predict limit 3")
    predictions = trainer.predict(model)
    mark("after limits")
    value("validate", val)
    value("test", test)
    value("num_test_batches", trainer.num_test_batches)
    value("num_predict_batches", trainer.num_predict_batches)

    reference = nn.Linear(3, 1)
    trainer.save_checkpoint(root / "final.ckpt")
    state = torch.load(root / "final.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    reference.load_state_dict({k.removeprefix("layer."): v for k, v in state.items()})
    rank, world = trainer.global_rank, trainer.world_size
    # limit 1 / 2 batches per rank: the first 8 / 16 samples of the (unshuffled) sets together
    with torch.no_grad():
        vx, vy = model.data["val"].tensors
        tx, ty = model.data["test"].tensors
        val_loss = float(F.mse_loss(reference(vx[:8]), vy[:8]))
        test_loss = float(F.mse_loss(reference(tx[:16]), ty[:16]))
        mine = rank_indices(32, world, rank, shuffle=False, seed=SEED, epoch=0)[: 3 * BATCH]
        expected = reference(tx[mine])
    check(
        "validate() with limit_val_batches=1 gives the loss of 1 batch per rank",
        close(val[0]["val_loss"], val_loss),
        (val, val_loss),
    )
    check(
        "test() with limit_test_batches=2 gives the loss of 2 batches per rank",
        close(test[0]["test_loss"], test_loss),
        (test, test_loss),
    )
    check(
        "predict() with limit_predict_batches=3 predicts 3 batches of this rank's share",
        len(predictions) == 3 and close(torch.cat(predictions), expected),
        len(predictions),
    )


if __name__ == "__main__":
    run(main)
