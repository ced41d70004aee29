"""Trainer options on 2 CPU processes (gloo); used by tests/test_trainer_options.py.

python tests/scripts/options_job.py --out DIR --mode syncbn --strategy ddp
python tests/scripts/options_job.py --out DIR --mode timer --strategy ddp

syncbn: a model with BatchNorm trained with sync_batchnorm=True (and profiler="simple"); rank 0 writes its weights and
running statistics to ``OUT/syncbn.pt`` (the test compares them with one BatchNorm over the
global batches in one process). timer: max_time stops both ranks at the same step and saves
``last.ckpt``; a second fit resumes from it with the elapsed time carried over; each rank writes
what it saw to ``OUT/timer<rank>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import fullshard
from fullshard.callbacks import ModelCheckpoint, Timer

RANK = int(os.environ.get("LOCAL_RANK", "0"))
BATCH, STEPS, LR = 4, 3, 0.1


def syncbn_data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2 * BATCH * STEPS, 3, generator=g) * 3 + 1
    return TensorDataset(x, x.sum(-1, keepdim=True))


def syncbn_layers() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))


class BNNet(fullshard.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = syncbn_layers()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=LR)


class SlowNet(fullshard.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(3, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        time.sleep(0.02 if self.trainer.global_rank == 0 else 0.05)  # rank 1 is slower
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def trainer(out: Path, strategy: str, **kwargs: Any) -> fullshard.Trainer:
    options: dict[str, Any] = dict(
        accelerator="cpu", devices=2, strategy=strategy, logger=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=out, num_sanity_val_steps=0,
    )  # fmt: skip
    options.update(kwargs)
    return fullshard.Trainer(**options)


def run_syncbn(out: Path, strategy: str) -> None:
    model = BNNet()
    t = trainer(
        out, strategy, max_steps=STEPS, enable_checkpointing=False, sync_batchnorm=True, profiler="simple",
        use_distributed_sampler="keep_shuffle",  # the reference reads the global batches in order
    )  # fmt: skip
    t.fit(model, DataLoader(syncbn_data(), batch_size=BATCH))
    state = {k: v.detach().clone() for k, v in t.strategy.module_state_dict().items()}
    kinds = sorted({type(m).__name__ for m in model.modules() if "BatchNorm" in type(m).__name__})
    if t.is_global_zero:
        torch.save({"state": state, "kinds": kinds}, out / "syncbn.pt")


def run_timer(out: Path, strategy: str) -> None:
    data = DataLoader(TensorDataset(torch.randn(4000, 3)), batch_size=2)
    ckpt = ModelCheckpoint(dirpath=out / "ckpts", save_last=True, save_top_k=0)
    t = trainer(out, strategy, max_time={"seconds": 1}, callbacks=[ckpt])
    started = time.monotonic()
    t.fit(SlowNet(), data)
    seen: dict[str, Any] = {
        "global_step": t.global_step, "should_stop": t.should_stop, "seconds": time.monotonic() - started,
        "max_epochs": t.max_epochs, "last": ckpt.last_model_path,
    }  # fmt: skip
    timer = next(cb for cb in t.callbacks if isinstance(cb, Timer))
    seen["elapsed"] = timer.time_elapsed()
    # resume with more time: the first run's elapsed time counts
    ckpt2 = ModelCheckpoint(dirpath=out / "ckpts2", save_last=True, save_top_k=0)
    t2 = trainer(out, strategy, max_time={"seconds": 2}, callbacks=[ckpt2])
    t2.fit(SlowNet(), data, ckpt_path=ckpt.last_model_path)
    timer2 = next(cb for cb in t2.callbacks if isinstance(cb, Timer))
    seen.update(resumed_step=t2.global_step, resumed_elapsed=timer2.time_elapsed())
    (out / f"timer{t.global_rank}.json").write_text(json.dumps(seen))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--mode", required=True, choices=["syncbn", "timer"])
    p.add_argument("--strategy", default="ddp")
    args = p.parse_args()
    fullshard.seed_everything(3)
    {"syncbn": run_syncbn, "timer": run_timer}[args.mode](args.out, args.strategy)


if __name__ == "__main__":
    main()
