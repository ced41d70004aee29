"""Warnings that read the same on every rank, in a 2-process job: each must appear once.

python tests/scripts/warnings_once_job.py --out DIR

Raises, while training: EarlyStopping's missing monitor (DDP), ModelCheckpoint's "dirpath
changed" on resuming into another directory and "exists and is not empty" (DDP), the FSDP wrap
plan's "selects no submodule"; after training: load_from_checkpoint(strict=False)'s partial
load, on every rank. A function under lightning_utilities' rank_zero_only, once a Trainer set its rank.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch
from lightning_utilities.core.rank_zero import rank_zero_only
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import fullshard
from fullshard.callbacks import EarlyStopping, ModelCheckpoint
from fullshard.strategies import FSDPStrategy


class Tiny(fullshard.Module):
    def __init__(self, extra: bool = False) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 1)
        if extra:
            self.extra = nn.Linear(1, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).sum()

    def configure_optimizers(self) -> Any:
        # momentum: resuming a stateless optimizer from a full checkpoint on 2 ranks fails (torch
        # asks the state for a device), which this script is not about
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def _trainer(**kwargs: Any) -> fullshard.Trainer:
    settings: dict[str, Any] = dict(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    return fullshard.Trainer(**{**settings, **kwargs})


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    out = parser.parse_args().out
    data = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2)

    first = ModelCheckpoint(dirpath=out / "first")
    stopping = EarlyStopping(monitor="not_logged", strict=False, verbose=True, check_on_train_epoch_end=True)
    _trainer(callbacks=[first, stopping]).fit(Tiny(), data)
    rank_zero_only(lambda: print("lightning_utilities' rank_zero_only ran", flush=True))()

    (out / "second").mkdir(exist_ok=True)
    (out / "second" / "notes.txt").touch()  # not empty
    second = _trainer(max_epochs=2, callbacks=[ModelCheckpoint(dirpath=out / "second")])
    second.fit(Tiny(), data, ckpt_path=first.best_model_path)

    no_units = FSDPStrategy(auto_wrap_policy={nn.Conv2d})  # the model has no Conv2d
    _trainer(strategy=no_units, max_steps=1, enable_checkpointing=False).fit(Tiny(), data)

    Tiny.load_from_checkpoint(first.best_model_path, strict=False, extra=True)
    print(f"rank {os.environ.get('LOCAL_RANK', '0')} done", flush=True)
