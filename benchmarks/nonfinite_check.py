"""What ``Trainer(on_nonfinite_loss=...)`` costs per optimizer step, on CPU.

Run from the repository root::

    python benchmarks/nonfinite_check.py

The workload of benchmarks/overhead.py (an MLP 512 -> 512 -> 512 -> 10, SGD, batch 64 per
process) as a hand-written DDP loop on 2 processes (gloo, one thread each), in segments of 100
steps run by turns without the check, with ``"raise"`` (the default: the loss read on each
process, no collective) and with ``"skip"`` (plus one ``all_gather`` of 3 numbers per process
per step, see fullshard.trainer.nonfinite). It prints the median time per step of each, and the
difference to the segments without the check. About a minute; the numbers go into
docs/checkpoints.md by hand.
"""

from __future__ import annotations

import os
import statistics
import time
from datetime import timedelta
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from fullshard.strategies import Strategy
from fullshard.trainer.nonfinite import NonFiniteLoss

STEPS = 100  # per segment
ROUNDS = 15  # each round: one segment of each variant, in a rotated order
MODES = ("none", "raise", "skip")


class Ranks:
    """What the check asks of a strategy: the base Strategy's all_gather, for 2 processes."""

    all_gather = Strategy.all_gather
    root_device = torch.device("cpu")
    world_size = 2

    def __init__(self, rank: int) -> None:
        self.global_rank = rank


def segment(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: torch.Tensor,
    check: NonFiniteLoss | None,
    trainer: SimpleNamespace,
) -> float:
    """Seconds per step over ``STEPS`` DDP steps."""
    target = torch.zeros(len(data), dtype=torch.long)
    dist.barrier()
    start = time.perf_counter()
    for step in range(STEPS):
        loss = nn.functional.cross_entropy(model(data), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if check is not None:
            check.observe(loss, step)
            if not check.step_allowed(trainer):  # type: ignore[arg-type]
                continue
        optimizer.step()
    return (time.perf_counter() - start) / STEPS


def worker(rank: int, port: int) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=120))
    torch.manual_seed(0)
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(64, 512)
    trainer = SimpleNamespace(
        strategy=Ranks(rank), optimizers=[optimizer], current_epoch=0, global_step=0, is_global_zero=rank == 0
    )
    checks = {"none": None, "raise": NonFiniteLoss("raise"), "skip": NonFiniteLoss("skip")}
    segment(model, optimizer, data, None, trainer)  # warm-up
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    for round_ in range(ROUNDS):
        for i in range(len(MODES)):
            mode = MODES[(round_ + i) % len(MODES)]
            times[mode].append(segment(model, optimizer, data, checks[mode], trainer))
    if rank == 0:
        base = statistics.median(times["none"])
        for mode in MODES:
            median = statistics.median(times[mode])
            print(
                f"{mode:>5}: {median * 1e3:.3f} ms per step ({(median - base) * 1e6:+.0f} us, {median / base:.3f}x)"
            )
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    print(f"2 processes, gloo, {ROUNDS} rounds of {STEPS}-step segments; medians:")
    mp.spawn(worker, args=(29000 + os.getpid() % 1000,), nprocs=2)


if __name__ == "__main__":
    main()
