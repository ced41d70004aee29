"""Porting script: a LightningCLI script driven by a YAML config (tests/porting/cli_yaml.yaml).

Covers: ``LightningCLI(Model, Data, args=[...])`` with subcommands ``fit`` and ``test
--ckpt_path``, ``--config`` with Lightning's class paths (``ModelCheckpoint``,
``LearningRateMonitor``, ``CSVLogger``), ``--trainer.strategy`` from the command line, the
automatic ``optimizer``/``lr_scheduler`` groups (the module has no ``configure_optimizers``),
``seed_everything`` from the config, ``trainer_defaults`` callbacks, ``before_fit``/``after_fit``,
``SaveConfigCallback``'s ``config.yaml``, ``run=False`` then ``trainer.predict``; checked
against plain PyTorch in one process.

    PORT_FRAMEWORK=fullshard python tests/porting/cli_yaml.py --strategy fsdp --out /tmp/p7
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
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
from reference import global_batches, rank_indices, state_close
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FRAMEWORK = os.environ.get("PORT_FRAMEWORK", "fullshard")
if FRAMEWORK == "lightning":
    import lightning.pytorch as L
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint
    from lightning.pytorch.cli import LightningCLI
else:
    import fullshard as L
    from fullshard.callbacks import Callback, ModelCheckpoint
    from fullshard.cli import LightningCLI

CONFIG = Path(__file__).with_suffix(".yaml")
SEED, EPOCHS, LR, MOMENTUM, GAMMA = 13, 3, 0.1, 0.9, 0.5


def make_net(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(3, hidden), nn.Tanh(), nn.Linear(hidden, 1))


class Model(RecordModuleHooks, L.LightningModule):
    def __init__(self, hidden: int = 4) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = make_net(hidden)

    def forward(self, x):
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


def make_data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    return TensorDataset(x, torch.sin(x).sum(-1, keepdim=True))


class Data(RecordDataModuleHooks, L.LightningDataModule):
    def __init__(self, batch_size: int = 8) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.train_set, self.val_set, self.test_set = make_data(32, 1), make_data(24, 2), make_data(16, 3)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.batch_size)

    def test_dataloader(self):
        return DataLoader(self.test_set, batch_size=self.batch_size)

    def predict_dataloader(self):
        return DataLoader(self.test_set, batch_size=self.batch_size)


class Recorder(RecordCallbackHooks, Callback):
    def on_validation_end(self, trainer, pl_module):
        snapshot("on_validation_end", trainer)

    def on_test_end(self, trainer, pl_module):
        snapshot("on_test_end", trainer)


class CLI(LightningCLI):
    def before_fit(self):
        mark("before_fit")

    def after_fit(self):
        mark("after_fit")

    def before_test(self):
        mark("before_test")

    def after_test(self):
        mark("after_test")


def reference(train: TensorDataset, world_size: int) -> dict:
    """The same training in one process: the global batches of every rank together."""
    torch.manual_seed(SEED)
    model = make_net(6)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, GAMMA)
    x, y = train.tensors
    for epoch in range(EPOCHS):
        for idx in global_batches(len(train), 4, world_size, shuffle=True, seed=SEED, epoch=epoch):
            optimizer.zero_grad()
            F.mse_loss(model(x[idx]), y[idx]).backward()
            optimizer.step()
        scheduler.step()
    return model.state_dict()


def weights(path: str) -> dict:
    state = torch.load(path, map_location="cpu", weights_only=False)["state_dict"]
    return {k.removeprefix("net."): v for k, v in state.items()}


def main(args):
    root = args.out / "work"
    common = [
        "--config",
        str(CONFIG),
        f"--trainer.strategy={args.strategy}",
        f"--trainer.default_root_dir={root}",
    ]

    mark("cli fit")
    cli = CLI(Model, Data, args=["fit", *common], trainer_defaults={"callbacks": [Recorder()]})
    trainer = cli.trainer
    checkpoint = next(c for c in trainer.callbacks if isinstance(c, ModelCheckpoint))
    value("global_step", trainer.global_step)
    value("current_epoch", trainer.current_epoch)
    value("lr_after_fit", trainer.optimizers[0].param_groups[0]["lr"])
    value("hidden", cli.model.hparams["hidden"])
    value("best_model_path", Path(checkpoint.best_model_path).name)
    value("log_dir", os.path.relpath(Path(trainer.log_dir).resolve(), args.out.resolve()))
    saved = yaml.safe_load(Path(trainer.log_dir, "config.yaml").read_text())
    check(
        "config.yaml in the log directory holds the run's configuration",
        saved["seed_everything"] == SEED
        and saved["model"]["hidden"] == 6
        and saved["trainer"]["max_epochs"] == EPOCHS,
        {k: saved.get(k) for k in ("seed_everything", "model")},
    )
    expected = reference(cli.datamodule.train_set, trainer.world_size)
    trainer.save_checkpoint(root / "final.ckpt")
    check(
        "final weights equal one-process training", *state_close(weights(str(root / "final.ckpt")), expected)
    )
    best = checkpoint.best_model_path

    mark("cli test")
    cli = CLI(
        Model,
        Data,
        args=["test", *common, f"--ckpt_path={best}"],
        trainer_defaults={"callbacks": [Recorder()]},
    )
    net = make_net(6)
    net.load_state_dict(weights(best))
    with torch.no_grad():
        x, y = cli.datamodule.test_set.tensors
        test_loss = float(F.mse_loss(net(x), y))
    value("test_loss", cli.trainer.callback_metrics["test_loss"])
    check(
        "test --ckpt_path gives the best weights' loss on the whole test set",
        close(cli.trainer.callback_metrics["test_loss"], test_loss),
        (cli.trainer.callback_metrics, test_loss),
    )

    mark("run=False")
    cli = CLI(Model, Data, args=common, run=False, save_config_callback=None)
    value("run_false_global_step", cli.trainer.global_step)
    mark("predict")
    predictions = cli.trainer.predict(cli.model, datamodule=cli.datamodule, ckpt_path=best)
    mark("after predict")
    rank, world = cli.trainer.global_rank, cli.trainer.world_size
    mine = rank_indices(16, world, rank, shuffle=False, seed=SEED, epoch=0)
    with torch.no_grad():
        wanted = net(cli.datamodule.test_set.tensors[0][mine])
    check(
        "predict() with the best weights predicts this rank's share",
        close(torch.cat(predictions), wanted),
        len(predictions),
    )


if __name__ == "__main__":
    run(main)
