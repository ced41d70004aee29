"""Porting script: the tuner's learning rate finder, then training with what it found.

Covers: ``Tuner(trainer).lr_find(model, ...)`` (the search inside ``fit``; ``results``,
``suggestion()``, the suggestion set on ``model.lr``; the model, its optimizer state and the
Trainer's step left as they were), a ``fit`` afterwards with the learning rate found, and the
``LearningRateFinder`` callback searching at the start of a fit that then trains on; checked
against the same training in one plain-PyTorch process.

    PORT_FRAMEWORK=fullshard python tests/porting/tuner_lr_find.py --strategy fsdp --out /tmp/p10
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from recording import RecordCallbackHooks, RecordModuleHooks, check, close, mark, run, snapshot, value
from reference import global_batches, state_close
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FRAMEWORK = os.environ.get("PORT_FRAMEWORK", "fullshard")
if FRAMEWORK == "lightning":
    import lightning.pytorch as L
    from lightning.pytorch.callbacks import Callback, LearningRateFinder
    from lightning.pytorch.tuner import Tuner
else:
    import fullshard as L
    from fullshard.callbacks import Callback, LearningRateFinder
    from fullshard.tuner import Tuner

SEED, BATCH, EPOCHS, SEARCH_STEPS = 5, 4, 2, 20


def make_data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, x @ torch.tensor([0.5, -1.0, 2.0, 1.0]) - 0.2)


TRAIN, VAL = make_data(64, 1), make_data(16, 2)


class Net(RecordModuleHooks, L.LightningModule):
    def __init__(self, lr: float = 1e-3) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
        self.lr = lr

    def forward(self, x):
        return self.net(x).squeeze(-1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def train_dataloader(self):
        return DataLoader(TRAIN, batch_size=BATCH, shuffle=True)

    def val_dataloader(self):
        return DataLoader(VAL, batch_size=BATCH)


class Recorder(RecordCallbackHooks, Callback):
    def on_train_start(self, trainer, pl_module):
        value(
            f"lr_at_train_start_{len(trainer.optimizers[0].param_groups)}",
            trainer.optimizers[0].param_groups[0]["lr"],
        )

    def on_validation_end(self, trainer, pl_module):
        snapshot("on_validation_end", trainer)


def reference(initial: dict, lr: float, world_size: int, epochs: int) -> dict:
    """One process: the same global batches, plain SGD at ``lr``."""
    model = Net()
    model.load_state_dict(initial)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    x, y = TRAIN.tensors
    for epoch in range(epochs):
        for idx in global_batches(len(TRAIN), BATCH, world_size, shuffle=True, seed=SEED, epoch=epoch):
            F.mse_loss(model(x[idx]), y[idx]).backward()
            optimizer.step()
            optimizer.zero_grad()
    return model.state_dict()


def trainer_for(args, root, callbacks):
    return L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=args.strategy,
        max_epochs=EPOCHS,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=callbacks,
        default_root_dir=root,
    )


def main(args):
    root = args.out / "work"
    L.seed_everything(SEED)
    model = Net()
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    trainer = trainer_for(args, root, [Recorder()])
    mark("lr_find")
    finder = Tuner(trainer).lr_find(model, num_training=SEARCH_STEPS, early_stop_threshold=None)
    mark("after lr_find")
    value("search_lrs", finder.results["lr"])
    value("search_losses", finder.results["loss"])
    suggestion = finder.suggestion()
    value("suggestion", suggestion)
    value("model_lr", model.lr)
    value("global_step_after_search", trainer.global_step)
    check("the suggestion is set on the model", model.lr == suggestion, (model.lr, suggestion))
    points = len(finder.results["lr"])
    check("the search stopped at max_epochs: 2 epochs of 8 steps", points == 16, points)

    mark("fit")
    trainer.fit(model)
    mark("after fit")
    snapshot("after fit", trainer)
    trainer.save_checkpoint(root / "tuned.ckpt")

    L.seed_everything(SEED)
    second = Net()
    callback_trainer = trainer_for(
        args, root, [Recorder(), LearningRateFinder(num_training_steps=SEARCH_STEPS)]
    )
    mark("fit with LearningRateFinder")
    callback_trainer.fit(second)
    mark("after second fit")
    value("callback_model_lr", second.lr)
    callback_trainer.save_checkpoint(root / "callback.ckpt")

    if trainer.global_rank == 0:
        tuned = torch.load(root / "tuned.ckpt", map_location="cpu", weights_only=False)["state_dict"]
        expected = reference(initial, suggestion, trainer.world_size, EPOCHS)
        check("after the search, training starts from the initial weights", *state_close(tuned, expected))
        trained = torch.load(root / "callback.ckpt", map_location="cpu", weights_only=False)["state_dict"]
        expected = reference(initial, second.lr, trainer.world_size, EPOCHS)
        check("LearningRateFinder's fit trains from the initial weights", *state_close(trained, expected))
        check(
            "the callback found the same learning rate", close(second.lr, suggestion), (second.lr, suggestion)
        )


if __name__ == "__main__":
    run(main)
