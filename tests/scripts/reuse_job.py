"""One model fit by a Trainer, then resumed and fit again by new Trainers, on 2 CPU processes under
FSDP1 and FSDP2, full and sharded checkpoints (tests/test_model_reuse.py).

python tests/scripts/reuse_job.py

Rank 0 prints one line per strategy and format: ``reuse <json>`` with the losses of the resumed
fit of the reused model and of a fresh model resumed from the same checkpoint (equal when the
optimizer's state was restored), and the steps each Trainer ran.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import fullshard
from fullshard.strategies import FSDP2Strategy, FSDPStrategy


class Tiny(fullshard.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 2)
        self.losses: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.layer(batch[0]).pow(2).mean()
        self.losses.append(round(loss.item(), 6))
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=0.1)  # per-parameter state to resume


def loader() -> DataLoader[Any]:
    return DataLoader(
        TensorDataset(torch.randn(32, 4, generator=torch.Generator().manual_seed(3))), batch_size=4
    )


def trainer(strategy: str, fmt: str, steps: int, root: Path) -> fullshard.Trainer:
    cls = FSDPStrategy if strategy == "fsdp" else FSDP2Strategy
    return fullshard.Trainer(
        accelerator="cpu", devices=2, strategy=cls(state_dict_type=fmt), max_steps=steps, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=root,
    )  # fmt: skip


def flow(strategy: str, fmt: str, root: Path) -> dict[str, Any]:
    fullshard.seed_everything(0)
    model = Tiny()
    first = trainer(strategy, fmt, 2, root)
    first.fit(model, loader())
    ckpt = root / f"{strategy}-{fmt}.ckpt"
    first.save_checkpoint(ckpt)
    model.losses.clear()
    resumed = trainer(strategy, fmt, 4, root)
    resumed.fit(model, loader(), ckpt_path=ckpt)  # the reused model, resumed
    reused_losses = list(model.losses)
    again = trainer(strategy, fmt, 1, root)
    again.fit(model, loader())  # and fit afresh once more
    fresh = Tiny()
    reference = trainer(strategy, fmt, 4, root)
    reference.fit(fresh, loader(), ckpt_path=ckpt)  # a new model resumed from the same checkpoint
    return {
        "strategy": strategy,
        "format": fmt,
        "reused": reused_losses,
        "fresh": fresh.losses,
        "steps": [first.global_step, resumed.global_step, again.global_step, reference.global_step],
    }


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp())
    for strategy in ("fsdp", "fsdp2"):
        for fmt in ("full", "sharded"):
            result = flow(strategy, fmt, root)
            if torch.distributed.get_rank() == 0:
                print("reuse " + json.dumps(result), flush=True)
