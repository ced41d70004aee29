"""A two-process CPU job in which a rank gets stuck, or fails after fit; tests/test_stuck_ranks.py
runs it.

Run it as (or under ``python -m torch.distributed.run --nproc-per-node 2 --standalone``):

    python tests/scripts/stuck_job.py SCENARIO --pid-dir DIR [--timeout SECONDS]

Every rank prints ``stuck-test rank=R pid=P`` first and writes its pid to DIR/rankR.pid.
``--timeout`` is ``DDPStrategy(stuck_rank_timeout=...)`` in seconds (default 3). SCENARIO:

- ``sleep_rank1`` / ``sleep_rank0``: that rank sleeps in ``on_train_batch_end`` of batch 2 (in
  :func:`nap_forever`); the job must end, naming it and showing that function.
- ``barrier_rank1``: rank 1 calls an extra ``dist.barrier()`` in ``on_train_batch_end`` of batch 2
  (in :func:`wait_in_extra_barrier`), which rank 0 never calls.
- ``healthy``: every training and validation batch takes ``0.3 * timeout`` (a validation takes
  longer than the timeout), and a checkpoint saved after the first batch takes ``1.2 *
  timeout`` to write: the job must exit 0.
- ``raise_after_fit_rank1``: after fit rank 1 raises while rank 0 is in
  ``trainer.save_checkpoint(...)``; ``raise_after_fit_rank0``: rank 0 raises while rank 1 is in
  ``trainer.validate(...)``.

Before a rank stops, it prints ``stuck-test rank=R stops at T`` (T: ``time.time()``).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

import fullshard
from fullshard.strategies import DDPStrategy

SCENARIOS = (
    "sleep_rank1",
    "sleep_rank0",
    "barrier_rank1",
    "healthy",
    "raise_after_fit_rank1",
    "raise_after_fit_rank0",
)


def announce_stop(rank: int) -> None:
    print(f"stuck-test rank={rank} stops at {time.time():.3f}", flush=True)


def nap_forever(rank: int) -> None:
    announce_stop(rank)
    time.sleep(600)


def wait_in_extra_barrier(rank: int) -> None:
    announce_stop(rank)
    dist.barrier()


class Net(fullshard.Module):
    def __init__(self, scenario: str, batch_sleep: float) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.scenario = scenario
        self.batch_sleep = batch_sleep

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        time.sleep(self.batch_sleep)
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        time.sleep(self.batch_sleep)
        self.log("val_loss", self.layer(batch[0]).pow(2).mean(), sync_dist=True)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        rank = self.trainer.global_rank
        if batch_idx == 0 and self.scenario == "healthy":
            self.trainer.save_checkpoint(Path(tempfile.mkdtemp(prefix="stuck-test-"), "in_fit.ckpt"))
        if batch_idx != 2:
            return
        if self.scenario == f"sleep_rank{rank}":
            nap_forever(rank)
        if self.scenario == "barrier_rank1" and rank == 1:
            wait_in_extra_barrier(rank)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def slow_checkpoint_writes(seconds: float) -> None:
    """Make every checkpoint write (inside ``strategy.save_checkpoint``) take ``seconds`` longer."""
    from fullshard.checkpoint import engine

    write = engine.save

    def slow_save(*args: Any, **kwargs: Any) -> Any:
        time.sleep(seconds)
        return write(*args, **kwargs)

    engine.save = slow_save


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=SCENARIOS)
    parser.add_argument("--pid-dir", required=True)
    parser.add_argument("--timeout", type=float, default=3.0)
    args = parser.parse_args()
    scenario = args.scenario
    healthy = scenario == "healthy"

    timeout = timedelta(seconds=args.timeout)
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(stuck_rank_timeout=timeout),
        max_steps=3 if healthy else 6,
        limit_val_batches=4,
        val_check_interval=2,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    rank = trainer.global_rank
    print(f"stuck-test rank={rank} pid={os.getpid()}", flush=True)
    Path(args.pid_dir, f"rank{rank}.pid").write_text(str(os.getpid()))
    data = DataLoader(TensorDataset(torch.randn(96, 4)), batch_size=8)
    if healthy:
        slow_checkpoint_writes(1.2 * args.timeout)
    model = Net(scenario, batch_sleep=0.3 * args.timeout if healthy else 0.0)
    trainer.fit(model, data, data if healthy else None)
    rank = trainer.global_rank  # the re-run copies learn their rank in fit
    print(f"stuck-test rank={rank} fit done", flush=True)

    checkpoint = Path(tempfile.mkdtemp(prefix="stuck-test-"), "after_fit.ckpt")
    if scenario.startswith("raise_after_fit"):
        failing = int(scenario[-1])
        if rank == failing:
            time.sleep(0.5)  # the other rank is inside its collective by then
            announce_stop(rank)
            raise ValueError(f"boom on rank {rank} after fit")
        if failing == 0:
            trainer.validate(model, data, verbose=False)
        else:
            trainer.save_checkpoint(checkpoint)
    print(f"stuck-test rank={rank} done", flush=True)


if __name__ == "__main__":
    main()
