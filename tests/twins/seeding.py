"""Random-number streams as Lightning's: the re-seeding of the distributed strategies when a
process joins the job.

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


if __name__ == "__main__":
    main()
