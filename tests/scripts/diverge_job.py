"""A two-process CPU job whose ranks may take different paths; tests/test_divergence.py runs it.

Run it as:

    python tests/scripts/diverge_job.py --strategy ddp --scenario skip_rank1 --agreement-timeout 3

SCENARIO picks the paths:

- ``skip_rank1``: ``training_step`` returns None on rank 1 only, at batch 2 (rank 0 goes on into
  the gradient reduction); the job must end with a RankDivergenceError naming rank 1.
- ``uneven_data``: an IterableDataset yields 3 batches on rank 0 and 5 on rank 1; the job must
  end with a RankDivergenceError naming both ranks.
- ``skip_all``: every rank returns None at batch 1 of each epoch, and the IterableDataset yields
  4 batches on every rank; the job must train on and exit 0.

Every rank prints ``diverge-test rank=R global_step=S batches=B`` when fit returns, and rank 0
``training starts at T`` (``time.time()``) as training starts, for the test to time the job's
end from there rather than from its start-up.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset

import fullshard
from fullshard.strategies import DDPStrategy, FSDPStrategy


class RankBatches(IterableDataset[torch.Tensor]):
    """``batches[rank]`` batches of 4 samples on each rank (the rank is read when iterating)."""

    def __init__(self, batches: list[int]) -> None:
        self.batches = batches

    def __iter__(self) -> Iterator[torch.Tensor]:
        count = self.batches[dist.get_rank()]
        generator = torch.Generator().manual_seed(count)
        for _ in range(count):
            yield torch.randn(4, 8, generator=generator)


class Net(fullshard.Module):
    def __init__(self, skip_batch: int, skip_ranks: tuple[int, ...]) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.skip_batch, self.skip_ranks = skip_batch, skip_ranks
        self.batches_seen = 0

    def on_train_start(self) -> None:
        if self.trainer.global_rank == 0:
            print(f"training starts at {time.time()!r}", flush=True)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> Any:
        self.batches_seen += 1
        loss = self.layer(batch).pow(2).mean()
        if batch_idx == self.skip_batch and self.trainer.global_rank in self.skip_ranks:
            return None
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", choices=["ddp", "fsdp"], default="ddp")
    parser.add_argument("--scenario", choices=["skip_rank1", "uneven_data", "skip_all"], required=True)
    parser.add_argument("--agreement-timeout", type=float, default=30.0)
    args = parser.parse_args()

    timeout = timedelta(seconds=args.agreement_timeout)
    strategy_class = FSDPStrategy if args.strategy == "fsdp" else DDPStrategy
    strategy = strategy_class(rank_agreement_timeout=timeout)
    batches = {"skip_rank1": [6, 6], "uneven_data": [3, 5], "skip_all": [4, 4]}[args.scenario]
    skip = {"skip_rank1": (2, (1,)), "uneven_data": (-1, ()), "skip_all": (1, (0, 1))}[args.scenario]
    model = Net(*skip)
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, DataLoader(RankBatches(batches), batch_size=None))
    print(
        f"diverge-test rank={trainer.global_rank} global_step={trainer.global_step}"
        f" batches={model.batches_seen}",
        flush=True,
    )


if __name__ == "__main__":
    main()
