"""A NaN loss on rank 1 only, under DDP on 2 CPU processes; used by tests/test_integrity.py.

python tests/scripts/nonfinite_job.py --out DIR --mode skip
python tests/scripts/nonfinite_job.py --out DIR --mode raise
python tests/scripts/nonfinite_job.py --out DIR --mode skip,raise  # both in turn, in one job

skip: both ranks must skip the same optimizer step and stay replicas; each rank writes what it
saw to ``OUT/rank<r>.json``. raise: rank 1 raises NonFiniteLossError and the job ends with it.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch
from ckpt_job import Net, make_data  # beside this script, on sys.path
from torch.utils.data import DataLoader

import fullshard
from fullshard.strategies import DDPStrategy

RANK = int(os.environ.get("LOCAL_RANK", "0"))


class NaNOnRank1(Net):
    """Its loss is NaN at batch 2 of each epoch, on rank 1 only."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        return loss * float("nan") if batch_idx == 2 and self.trainer.global_rank == 1 else loss


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--mode", required=True, help="skip, raise, or several in turn: skip,raise")
    args = p.parse_args()
    for mode in args.mode.split(","):
        if mode not in ("skip", "raise"):
            p.error(f"--mode: {mode!r} is not skip or raise")
        run(args.out, mode)


def run(out: Path, mode: str) -> None:
    fullshard.seed_everything(11)
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(),
        max_steps=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        on_nonfinite_loss=mode,
        default_root_dir=out,
    )
    model = NaNOnRank1()
    trainer.fit(model, DataLoader(make_data(), batch_size=8))
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    log = {
        "global_step": trainer.global_step,
        "batches": trainer.fit_loop.progress.total_batch_idx,
        "finite": bool(torch.isfinite(params).all()),
        "replicas_equal": all(
            torch.equal(params, other) for other in trainer.strategy.all_gather_object(params)
        ),
    }
    (out / f"rank{RANK}.json").write_text(json.dumps(log))


if __name__ == "__main__":
    main()
