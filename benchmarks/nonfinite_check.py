"""python benchmarks/nonfinite_check.py

What ``Trainer(on_nonfinite_loss=...)`` costs per optimizer step, on CPU.

Run it from the repository root (about a minute). It has no ``--write-docs`` and no section in
docs/benchmarks.md: it prints three lines, and their figures go into docs/checkpoints.md (the
``on_nonfinite_loss`` part) by hand.

The workload of benchmarks/overhead.py (an MLP 512 -> 512 -> 512 -> 10, SGD, batch 64 per
process) as a hand-written DDP loop on 2 processes (gloo, one thread each), in segments of 100
steps run by turns without the check, with ``"raise"`` (the default: the loss read on each
process, no collective) and with ``"skip"`` (plus one ``all_gather`` of 3 numbers per process
per step, see fullshard.trainer.nonfinite), ``--rounds`` times each in a rotated order. It
prints the median time per step of each, and the difference to the segments without the check.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import timedelta
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _common import make_parser, parse_args, rotations
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from fullshard.strategies import Strategy
from fullshard.trainer.nonfinite import NonFiniteLoss

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
    steps: int,
) -> float:
    """Seconds per step over ``steps`` DDP steps."""
    target = torch.zeros(len(data), dtype=torch.long)
    dist.barrier()
    start = time.perf_counter()
    for step in range(steps):
        loss = nn.functional.cross_entropy(model(data), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if check is not None:
            check.observe(loss, step)
            if not check.step_allowed(trainer):  # type: ignore[arg-type]
                continue
        optimizer.step()
    return (time.perf_counter() - start) / steps


def worker(rank: int, port: int, rounds: int, steps: int) -> None:
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
    segment(model, optimizer, data, None, trainer, steps)  # warm-up
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    for order in rotations(MODES, rounds):
        for mode in order:
            times[mode].append(segment(model, optimizer, data, checks[mode], trainer, steps))
    if rank == 0:
        base = statistics.median(times["none"])
        for mode in MODES:
            median = statistics.median(times[mode])
            print(
                f"{mode:>5}: {median * 1e3:.3f} ms per step ({(median - base) * 1e6:+.0f} us, {median / base:.3f}x)"
            )
    dist.barrier()
    dist.destroy_process_group()


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser(__file__, __doc__, write_docs=None)
    parser.add_argument("--rounds", type=int, default=15, help="rounds of one segment of each variant")
    parser.add_argument("--steps", type=int, default=100, help="steps per segment")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = parse_args(build_parser(), argv)
    print(f"2 processes, gloo, {args.rounds} rounds of {args.steps}-step segments; medians:")
    mp.spawn(worker, args=(29000 + os.getpid() % 1000, args.rounds, args.steps), nprocs=2)


if __name__ == "__main__":
    main()
