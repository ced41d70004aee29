"""Train under torchrun with ModelCheckpoint and ``fit(ckpt_path="last")``; used by
tests/test_elastic.py. With ``--die-at K``, global rank 1 of the first attempt
(``TORCHELASTIC_RESTART_COUNT=0``) kills itself with ``os._exit(1)`` when step K begins, so that
torchrun restarts the workers and the new attempt resumes from the newest checkpoint.

TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone --nproc-per-node=2 --max-restarts=1 \
    tests/scripts/elastic_job.py --out DIR --die-at 7
torchrun --standalone --nproc-per-node=3 tests/scripts/elastic_job.py --out DIR --tag again  # at 3 processes

With ``--die-in-save K``, global rank 0 of the first attempt is killed (SIGKILL) in the middle of
step K's checkpoint save, after its files are written and before its commit.
With ``--stall-at K`` instead, the last rank of a first attempt that spans several nodes stalls
at step K and writes its pid to ``stalled``, for the test to remove its node; a first attempt of
one node (the first agent's rendezvous completed before the second agent joined) waits, without
training, for torchrun to restart it with both nodes, so that no head start decides the test.

Each attempt writes ``<tag>-attempt<R>-rank<r>.json`` (the checkpoint it resumed from, the step
it started at, and ``[step, loss]`` per step), and rank 0 writes ``<tag>-start<R>.pt`` (the full
parameters when training starts, after the resume) and ``<tag>-final.pt`` (when it ends).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import fullshard
from fullshard.checkpoint.events import set_event_hook
from fullshard.strategies import DDPStrategy, FSDPStrategy, Strategy

DIM = 8


class Net(fullshard.Module):
    def __init__(self, out: Path, run: str, die_at: int | None, stall_at: int | None = None) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(DIM, DIM), nn.ReLU(), nn.Dropout(0.2), nn.Linear(DIM, DIM))
        self.head = nn.Linear(DIM, 1)
        self.out, self.run_name, self.die_at, self.stall_at = out, run, die_at, stall_at
        self.attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
        self.losses: list[list[float]] = []
        self.start_step = -1

    def on_train_start(self) -> None:
        self.start_step = self.trainer.global_step
        params = self.trainer.strategy.module_state_dict()  # collective: every rank calls it
        if self.global_rank == 0:
            torch.save(params, self.out / f"{self.run_name}-start{self.attempt}.pt")

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        step = self.trainer.global_step
        if step == self.die_at and self.attempt == 0 and self.global_rank == 1:
            self._write()  # what this attempt did so far, then die as a crashed process would
            os._exit(1)
        last_rank_of_several_nodes = (
            self.trainer.strategy.num_nodes > 1 and self.global_rank == self.trainer.world_size - 1
        )
        if step == self.stall_at and self.attempt == 0 and last_rank_of_several_nodes:
            (self.out / "stalling").write_text(str(os.getpid()))
            os.replace(self.out / "stalling", self.out / "stalled")  # the test now removes this rank's node
            time.sleep(600)
        x, y = batch
        loss = F.mse_loss(self.head(self.body(x)).squeeze(-1), y)
        self.losses.append([step, float(loss.detach())])
        return loss

    def on_train_end(self) -> None:
        self._write()

    def _write(self) -> None:
        record = {
            "world_size": self.trainer.world_size,
            "ckpt_path": self.trainer.ckpt_path,
            "start_step": self.start_step,
            "losses": self.losses,
        }
        (self.out / f"{self.run_name}-attempt{self.attempt}-rank{self.global_rank}.json").write_text(
            json.dumps(record)
        )

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=0.01)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def make_data() -> TensorDataset:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(64, DIM, generator=g)  # 8 steps an epoch at 2 processes: step 6 is mid-epoch
    return TensorDataset(x, x.sum(dim=1).sin())


def make_strategy(name: str) -> Strategy:
    if name == "ddp":
        return DDPStrategy()
    return FSDPStrategy(state_dict_type="full" if name == "fsdp-full" else "sharded")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--strategy", default="fsdp", choices=["fsdp", "fsdp-full", "ddp"])
    p.add_argument("--max-steps", type=int, default=12)
    p.add_argument("--save-every", type=int, default=3)
    p.add_argument(
        "--stall-at", type=int, default=None, help="in a job of several nodes, the last rank stalls here"
    )
    p.add_argument("--tag", default="run", help="prefix of the files this run writes")
    p.add_argument("--die-at", type=int, default=None, help="rank 1 of the first attempt dies at this step")
    p.add_argument(
        "--die-in-save",
        type=int,
        default=None,
        help="rank 0 of the first attempt is killed in this step's save",
    )
    args = p.parse_args()
    out = Path(args.out)
    first_attempt = os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
    if args.stall_at is not None and first_attempt and os.environ["GROUP_WORLD_SIZE"] == "1":
        time.sleep(600)  # torchrun restarts these workers once the second node joins
    fullshard.seed_everything(11)
    checkpoint = fullshard.ModelCheckpoint(
        dirpath=out / "ckpts", every_n_train_steps=args.save_every, save_top_k=-1, save_last=True
    )
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices="auto",
        num_nodes="auto",
        strategy=make_strategy(args.strategy),
        max_steps=args.max_steps,
        logger=False,
        callbacks=[checkpoint],
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=out,
    )
    model = Net(out, args.tag, args.die_at, args.stall_at)
    if args.die_in_save is not None and model.attempt == 0:

        def die_before_commit(point: str) -> None:
            # rank 0 commits a sharded checkpoint: killed here, the save's files are written but
            # the checkpoint is not complete
            if point == "sharded.before_commit" and trainer.global_step == args.die_in_save:
                os.kill(os.getpid(), signal.SIGKILL)

        set_event_hook(die_before_commit)
    loader = DataLoader(make_data(), batch_size=4, shuffle=True)
    trainer.fit(model, loader, ckpt_path="last")
    params = trainer.strategy.module_state_dict()
    if trainer.global_rank == 0:
        torch.save(params, out / f"{args.tag}-final.pt")


if __name__ == "__main__":
    main()
