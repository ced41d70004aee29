"""Train a small MLP with the Trainer; used by the multi-process tests.

python tests/scripts/train_mlp.py --out DIR --devices 2 --strategy ddp --max-steps 8
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import fullshard


def make_data(n: int = 96, dim: int = 8) -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, dim, generator=g)
    y = (x @ torch.randn(dim, 1, generator=g)).squeeze(-1) + 0.1 * torch.randn(n, generator=g)
    return TensorDataset(x, y)


class MLP(fullshard.Module):
    def __init__(
        self,
        dim: int = 8,
        hidden: int = 32,
        dropout: float = 0.0,
        fail_at: int = -1,
        fail_rank: int = -1,
        lr: float = 0.05,
        scheduler: bool = False,
    ) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(dim, hidden),
            torch.nn.ReLU(),
            torch.nn.Dropout(dropout),
            torch.nn.Linear(hidden, 1),
        )
        self.fail_at, self.fail_rank, self.lr, self.scheduler = fail_at, fail_rank, lr, scheduler
        self.fail_marker: str | None = None
        self.losses: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.trainer.global_step == self.fail_at and self.trainer.global_rank == self.fail_rank:
            if self.fail_marker is not None:  # when it failed, for the test to time the job's end from
                Path(self.fail_marker, f"failed_rank{self.fail_rank}").write_text(repr(time.time()))
            raise ValueError(f"boom on rank {self.fail_rank}")
        x, y = batch
        loss = F.mse_loss(self.net(x).squeeze(-1), y)
        self.log("train_loss", loss, prog_bar=True)
        self.losses.append(float(loss.detach()))
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.mse_loss(self.net(x).squeeze(-1), y), sync_dist=True)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.Adam(self.parameters(), lr=self.lr)
        if not self.scheduler:
            return opt
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--strategy", default="ddp")
    p.add_argument("--max-steps", type=int, default=8)
    p.add_argument("--max-epochs", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--shuffle", action="store_true")
    p.add_argument("--scheduler", action="store_true")
    p.add_argument("--accumulate", type=int, default=1)
    p.add_argument("--fail-at", type=int, default=-1)
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--save", default=None, help="save a checkpoint here after fit")
    p.add_argument("--resume", default=None, help="fit(ckpt_path=...)")
    p.add_argument("--num-workers", type=int, default=0)
    args = p.parse_args()

    fullshard.seed_everything(7)
    model = MLP(
        dropout=args.dropout, fail_at=args.fail_at, fail_rank=args.fail_rank, scheduler=args.scheduler
    )
    model.fail_marker = args.out
    trainer = fullshard.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        strategy=args.strategy,
        max_steps=args.max_steps,
        max_epochs=args.max_epochs,
        accumulate_grad_batches=args.accumulate,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=args.out,
        # the tests compare with single-process runs and plain loops reading the data in the
        # loader's order (Lightning's default sampler would shuffle an unshuffled loader)
        use_distributed_sampler="keep_shuffle",
    )
    loader = DataLoader(
        make_data(), batch_size=args.batch_size, shuffle=args.shuffle, num_workers=args.num_workers
    )
    trainer.fit(model, loader, ckpt_path=args.resume)
    if args.save:
        trainer.save_checkpoint(args.save)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rank = trainer.global_rank
    (out / f"losses_rank{rank}.json").write_text(json.dumps(model.losses))
    if trainer.is_global_zero:
        torch.save({k: v.clone() for k, v in model.state_dict().items()}, out / "params.pt")
        (out / "progress.json").write_text(
            json.dumps(
                {
                    "global_step": trainer.global_step,
                    "epoch": trainer.current_epoch,
                    "world_size": trainer.world_size,
                    "pid": os.getpid(),
                }
            )
        )


if __name__ == "__main__":
    main()
