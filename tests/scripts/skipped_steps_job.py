"""Training steps that return None under FSDP (FSDP2, DDP) on two CPU processes, or on one;
tests/test_skipped_steps.py runs it.

    python tests/scripts/skipped_steps_job.py --devices 2 --strategy fsdp --out /tmp/skipped.json

Every rank returns None at the same batches (one mixed accumulation window, one all None), with
gradient clipping and a step-interval scheduler; rank 0 writes the counters, the learning rates
each training step saw and the final weights (the three strategies' are the same training).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

import fullshard
from fullshard.strategies import DDPStrategy, FSDP2Strategy, FSDPStrategy

STRATEGIES: dict[str, Any] = {"fsdp": FSDPStrategy, "fsdp2": FSDP2Strategy, "ddp": DDPStrategy}


class Net(fullshard.Module):
    def __init__(self, none_at: tuple[int, ...]) -> None:
        super().__init__()
        self.none_at = none_at
        torch.manual_seed(3)
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        self.seen: list[list[Any]] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        scheduler = self.lr_schedulers()
        self.seen.append([batch_idx, self.trainer.global_step, scheduler.last_epoch])
        if batch_idx in self.none_at:
            return None
        x, y = batch
        return torch.nn.functional.mse_loss(self.body(x), y)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.8)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--strategy", choices=["fsdp", "fsdp2", "ddp"], default="fsdp")
    parser.add_argument("--out", required=True)
    # windows of 2: [2, 3] None first, [4, 5] all None; a None last in a window after a loss
    # (1) is refused under several processes
    parser.add_argument("--none-at", type=int, nargs="*", default=[2, 4, 5])
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=g)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8 // (2 * args.devices))
    model = Net(tuple(args.none_at))
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=STRATEGIES[args.strategy]() if args.devices > 1 else "auto",
        max_epochs=1,
        accumulate_grad_batches=2,
        gradient_clip_val=0.5,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, data)
    state = trainer.strategy.get_state([], full=True)[0]  # every rank takes part; rank 0 gets it
    if trainer.global_rank == 0:
        result = {
            "global_step": trainer.global_step,
            "seen": model.seen,
            "lr": trainer.optimizers[0].param_groups[0]["lr"],
            "weights": {k: v.detach().float().flatten().tolist() for k, v in state.items()},
        }
        Path(args.out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
