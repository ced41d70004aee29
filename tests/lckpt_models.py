"""fullshard's side of the Lightning interoperability tests: the model of
tests/scripts/lckpt_lightning.py as a ``fullshard.Module``, its data, and helpers to run it.

The fixture tests/fixtures/lightning_2.6.6_mlp.ckpt is Lightning's checkpoint of this model after
9 of 16 steps (epoch 1, one batch into it); see the script for how it was made.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import fullshard
import lightning_env

FIXTURES = Path(__file__).parent / "fixtures"
LIGHTNING_FIXTURE = FIXTURES / "lightning_2.6.6_mlp.ckpt"
LIGHTNING_SCRIPT = Path(__file__).parent / "scripts" / "lckpt_lightning.py"


class MLP(fullshard.Module):
    def __init__(self, hidden: int = 8, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))
        self.loaded: dict[str, Any] | None = None

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        self.calls += 1
        return F.mse_loss(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> Any:
        opt, sched = make_optimizer(self)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.loaded = checkpoint


def make_optimizer(model: MLP) -> tuple[torch.optim.Optimizer, Any]:
    lr = model.hparams.lr
    opt = torch.optim.AdamW(
        [{"params": model.net[0].parameters()}, {"params": model.net[2].parameters(), "lr": lr / 2}],
        lr=lr,
        weight_decay=0.01,
    )
    return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)


def make_data() -> TensorDataset:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(32, 4, generator=g)
    return TensorDataset(x, x.sum(-1, keepdim=True).sin())


def loader() -> DataLoader:
    return DataLoader(make_data(), batch_size=4, shuffle=False)


def batches(world_size: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One epoch of global batches: with ``world_size`` processes each rank takes every
    ``world_size``-th sample (DistributedSampler without shuffling), 4 per step, so a step's
    global batch is ``4 * world_size`` consecutive samples."""
    x, y = make_data().tensors
    size = 4 * world_size
    return [(x[i : i + size], y[i : i + size]) for i in range(0, len(x), size)]


def plain_continuation(
    checkpoint: dict[str, Any], steps: list[tuple[torch.Tensor, torch.Tensor]]
) -> dict[str, Any]:
    """Continue a checkpoint of ``MLP`` with a plain PyTorch loop (no Trainer) over the batches
    ``steps``: what the uninterrupted run would have done from the checkpoint's state."""
    model = MLP(**checkpoint["hyper_parameters"])
    model.load_state_dict(checkpoint["state_dict"])
    opt, sched = make_optimizer(model)
    opt.load_state_dict(checkpoint["optimizer_states"][0])
    sched.load_state_dict(checkpoint["lr_schedulers"][0])
    for x, y in steps:
        model.calls += 1
        loss = F.mse_loss(model.net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    return {"state_dict": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict()}


def lightning_python() -> str:
    """A Python interpreter that can import Lightning: this one, else the separate environment
    (tests/lightning_env.py: a test calling this fails when neither has it, naming the command)."""
    if importlib.util.find_spec("lightning") is not None:
        return sys.executable
    return str(lightning_env.require())


def run_lightning(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run tests/scripts/lckpt_lightning.py with a Python that has Lightning."""
    python = lightning_python()
    env = {
        k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "WORLD_SIZE", "RANK", "MASTER_PORT")
    }
    return subprocess.run(
        [python, str(LIGHTNING_SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env
    )
