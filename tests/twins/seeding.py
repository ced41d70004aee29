"""Random-number streams as Lightning's: the re-seeding of the distributed strategies when a
process joins the job, and what the loaders draw from the global generator (a shuffling
loader's order on one device, the iterators' base seeds at each epoch and validation run).

TWIN_FRAMEWORK=lightning /tmp/lvenv/bin/python tests/twins/seeding.py --out /tmp/l.json
TWIN_FRAMEWORK=fullshard python tests/twins/seeding.py --out /tmp/f.json
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset
from twin import imp, main

L = imp()


def trainer(**kwargs: Any) -> Any:
    options: dict[str, Any] = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    options.update(kwargs)
    return L.Trainer(**options)


def regression(n: int = 24, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g))


class BuiltInConfigureModel(L.LightningModule):
    """Draws in ``setup`` and builds its layers in ``configure_model``: what it drew and the
    initial weights show the generator states the run starts from; the losses, the training."""

    def __init__(self) -> None:
        super().__init__()
        self.net: torch.nn.Module | None = None
        self.drawn: dict[str, Any] = {}
        self.losses: list[float] = []

    def setup(self, stage: str) -> None:
        self.drawn = {"torch": torch.rand(2), "python": random.random()}

    def configure_model(self) -> None:
        if self.net is None:
            self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
            self.drawn["initial weights"] = float(sum(p.sum() for p in self.net.parameters()))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)  # type: ignore[misc]
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _fit_after_drawing(strategy: str, workers: bool = False) -> Any:
    L.seed_everything(21, workers=workers)
    torch.randn(5)  # the script draws after seeding (building a model, splitting a dataset)
    random.random()
    model = BuiltInConfigureModel()
    trainer(strategy=strategy, max_steps=4).fit(model, DataLoader(regression(), batch_size=6))
    return {"drawn": model.drawn, "losses": model.losses}


# ----------------------------------------------------------------- re-seeding at distributed setup
def case_ddp_reseeds_at_setup(tmp: Path) -> Any:
    """DDP (here one process) seeds again from seed_everything's record when the process joins
    the job: ``setup`` draws and ``configure_model`` builds as right after seeding."""
    return _fit_after_drawing("ddp")


def case_ddp_reseeds_with_the_workers_flag(tmp: Path) -> Any:
    return _fit_after_drawing("ddp", workers=True)


def case_single_device_does_not_reseed(tmp: Path) -> Any:
    """Without a distributed strategy the streams go on from where the script left them."""
    return _fit_after_drawing("auto")


def case_no_seed_everything_no_reseed(tmp: Path) -> Any:
    """Without seed_everything there is nothing to seed again from: the draws go on."""
    import os

    for name in ("PL_GLOBAL_SEED", "FULLSHARD_GLOBAL_SEED"):
        os.environ.pop(name, None)
    torch.manual_seed(4)
    random.seed(4)
    model = BuiltInConfigureModel()
    trainer(strategy="ddp", max_steps=1).fit(model, DataLoader(regression(), batch_size=6))
    return {"drawn": model.drawn}


# ------------------------------------------------------------------- the loaders' draws
class DropoutNet(L.LightningModule):
    """Dropout in training; every step's loss, the validation losses and a draw in each
    epoch's start hook show the global stream."""

    def __init__(self, lr: float = 0.05, batch_size: int = 6) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.lr, self.batch_size = lr, batch_size
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 16), torch.nn.Dropout(0.3), torch.nn.ReLU(), torch.nn.Linear(16, 1)
        )
        self.losses: list[float] = []
        self.val_losses: list[float] = []
        self.epoch_draws: list[float] = []

    def on_train_epoch_start(self) -> None:
        self.epoch_draws.append(float(torch.rand(())))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def on_validation_epoch_end(self) -> None:
        if not self.trainer.sanity_checking:
            self.val_losses.append(float(self.trainer.callback_metrics["val_loss"]))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(regression(40, 1), batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(regression(12, 2), batch_size=4)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def _observed(model: DropoutNet) -> dict[str, Any]:
    return {
        "losses": model.losses,
        "val_losses": model.val_losses,
        "epoch_draws": model.epoch_draws,
        "weights": [p.sum() for p in model.parameters()],
        "after": float(torch.rand(())),
    }


def case_shuffled_loader_with_dropout_and_validation(tmp: Path) -> Any:
    """One device, a ``shuffle=True`` loader, dropout, 3 epochs with validation: the order is
    the RandomSampler's, drawn from the global generator, and every later draw as Lightning's."""
    L.seed_everything(3)
    model = DropoutNet()
    trainer(max_epochs=3).fit(model)
    return _observed(model)


def case_validate_draws_as_lightning(tmp: Path) -> Any:
    """A validation run's iterator draws its base seed from the global generator."""
    L.seed_everything(5)
    model = DropoutNet()
    t = trainer()
    t.validate(model, verbose=False)
    t.validate(model, verbose=False)
    return {"after": float(torch.rand(()))}


def case_scale_batch_size_then_lr_find_shuffled(tmp: Path) -> Any:
    """The tuner's sequence with a shuffled loader and dropout: the batch size, the suggested
    learning rate and the following epochs' validation losses as Lightning's."""
    Tuner = imp("tuner").Tuner
    L.seed_everything(7)
    t = trainer(max_epochs=5, default_root_dir=tmp)  # 25 steps at the batch size found: lr_find's points
    model = DropoutNet(lr=0.01, batch_size=2)
    tuner = Tuner(t)
    found = tuner.scale_batch_size(model, max_trials=3, steps_per_trial=2)
    finder = tuner.lr_find(model, num_training=25, early_stop_threshold=None)
    model.val_losses.clear()
    t.fit(model)
    return {"batch_size": found, "suggestion": finder.suggestion(), "val_losses": model.val_losses}


if __name__ == "__main__":
    main()
