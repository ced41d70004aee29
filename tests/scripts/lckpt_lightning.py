"""Lightning's side of the Lightning interoperability tests: run it with a Python that has Lightning.

Lightning is never a dependency of fullshard; this script imports only torch and Lightning, so it
runs in a separate environment::

    python tests/scripts/lckpt_lightning.py make OUT_DIR
    python tests/scripts/lckpt_lightning.py load FULLSHARD.ckpt OUT.pt [FULLSHARD2.ckpt OUT2.pt ...]

``make`` trains the MLP below for two epochs of eight steps and writes into ``OUT_DIR``:

- ``step=3.ckpt``, ``step=6.ckpt``, ...: ``ModelCheckpoint(every_n_train_steps=3)`` (mid-epoch);
- ``epoch=0-step=8.ckpt``: ``ModelCheckpoint`` at the end of the first epoch;
- ``final.ckpt``: ``trainer.save_checkpoint`` after ``fit`` returned;
- ``straight.pt``: weights and optimizer state after the 16 steps;
- ``continued.pt``: the same after Lightning resumed from ``epoch=0-step=8.ckpt`` to 16 steps.

``load`` builds the model with ``MLP.load_from_checkpoint`` from each checkpoint fullshard wrote
and saves its state dict, hyperparameters, training flag and device to the ``OUT.pt`` after it.

tests/fixtures/lightning_2.6.6_mlp.ckpt is ``step=9.ckpt`` of a ``make`` run with Lightning 2.6.6.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class MLP(L.LightningModule):
    """The same model as tests/lckpt_models.py's ``MLP`` (a fullshard.Module)."""

    def __init__(self, hidden: int = 8, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        self.calls += 1
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        lr = self.hparams.lr
        # two parameter groups: Lightning numbers the parameters across both
        opt = torch.optim.AdamW(
            [{"params": self.net[0].parameters()}, {"params": self.net[2].parameters(), "lr": lr / 2}],
            lr=lr,
            weight_decay=0.01,
        )
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def make_data() -> TensorDataset:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(32, 4, generator=g)
    return TensorDataset(x, x.sum(-1, keepdim=True).sin())


def loader() -> DataLoader:
    return DataLoader(make_data(), batch_size=4, shuffle=False)


def trainer(root: Path, callbacks: list[Any]) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        default_root_dir=root,
    )


def state_of(t: L.Trainer, model: MLP) -> dict[str, Any]:
    return {
        "state_dict": {k: v.clone() for k, v in model.state_dict().items()},
        "optimizer": t.optimizers[0].state_dict(),
        "scheduler": t.lr_scheduler_configs[0].scheduler.state_dict(),
        "global_step": t.global_step,
        "epoch": t.current_epoch,
    }


def make(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    L.seed_everything(7)
    model = MLP()
    t = trainer(
        out,
        [
            ModelCheckpoint(dirpath=out, filename="{step}", every_n_train_steps=3, save_top_k=-1),
            ModelCheckpoint(dirpath=out, every_n_epochs=1, save_top_k=-1),
        ],
    )
    t.fit(model, loader())
    t.save_checkpoint(out / "final.ckpt")
    torch.save(state_of(t, model), out / "straight.pt")

    L.seed_everything(7)
    model = MLP()
    t = trainer(out / "resumed", [])
    t.fit(model, loader(), ckpt_path=out / "epoch=0-step=8.ckpt")
    torch.save(state_of(t, model), out / "continued.pt")


def load(checkpoint: Path, out: Path) -> None:
    model = MLP.load_from_checkpoint(checkpoint)
    torch.save(
        {
            "state_dict": model.state_dict(),
            "hparams": dict(model.hparams),
            "training": model.training,
            "device": str(model.device),
        },
        out,
    )


if __name__ == "__main__":
    warnings.filterwarnings("ignore")
    command, *args = sys.argv[1:]
    if command == "make":
        make(Path(args[0]))
    elif command == "load":
        for checkpoint, out in zip(args[::2], args[1::2], strict=True):
            load(Path(checkpoint), Path(out))
    else:
        raise SystemExit(
            f"unknown command {command!r}; use 'make OUT_DIR' or 'load CKPT OUT.pt [CKPT OUT.pt ...]'"
        )
