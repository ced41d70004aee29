"""python benchmarks/nonfinite_check.py --write-docs

What ``Trainer(on_nonfinite_loss=...)`` costs per optimizer step, on CPU.

Run it from the repository root (about a minute); without ``--write-docs`` it prints three
lines and leaves docs/benchmarks.md ("Non-finite loss check") alone. docs/checkpoints.md (the
``on_nonfinite_loss`` part) quotes the figures by hand.

The workload of benchmarks/overhead.py (an MLP 512 -> 512 -> 512 -> 10, SGD, batch 64 per
process) as a hand-written DDP loop on 2 processes (gloo, one thread each), in segments of 100
steps run by turns without the check, with ``"raise"`` (the default: the loss read on each
process, no collective) and with ``"skip"`` (plus one ``all_gather`` of 3 numbers per process
per step, see fullshard.trainer.nonfinite), ``--rounds`` times each in a rotated order. It
prints the median time per step of each, and the difference to the segments without the check.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _common import (
    heading_target,
    make_parser,
    parse_args,
    provenance,
    rotations,
    run_or_report,
    table,
    write_section,
)
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from fullshard.strategies import Strategy
from fullshard.trainer.nonfinite import NonFiniteLoss

MODES = ("none", "raise", "skip")
SECTION = "## Non-finite loss check"


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


def worker(rank: int, port: int, rounds: int, steps: int, out: str) -> None:
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
        Path(out).write_text(json.dumps(times))
    dist.barrier()
    dist.destroy_process_group()


def lines(times: dict[str, list[float]]) -> list[str]:
    """The median time per step of each mode, and its difference to no check."""
    base = statistics.median(times["none"])
    return [
        f"{mode:>5}: {statistics.median(times[mode]) * 1e3:.3f} ms per step "
        f"({(statistics.median(times[mode]) - base) * 1e6:+.0f} us, {statistics.median(times[mode]) / base:.3f}x)"
        for mode in MODES
    ]


def render(result: dict[str, Any]) -> str:
    """The section of docs/benchmarks.md, from a result (rank 0's segment times, saved)."""
    times, args = result["figures"], argparse.Namespace(**result["arguments"])
    base = statistics.median(times["none"])
    rows = [
        [
            f"`{mode!r}`" if mode != "none" else "`None`",
            f"{statistics.median(times[mode]) * 1e3:.3f}",
            f"{(statistics.median(times[mode]) - base) * 1e6:+.0f}",
            f"{statistics.median(times[mode]) / base:.3f}x",
        ]
        for mode in MODES
    ]
    return (
        "\n".join(
            [
                SECTION,
                "",
                "What `Trainer(on_nonfinite_loss=...)` costs per optimizer step: benchmarks/overhead.py's workload as a",
                f"hand-written DDP loop in 2 CPU processes (gloo, one thread each), {args.rounds} rounds of",
                f"{args.steps}-step segments of each mode in rotated order; medians of rank 0's segments.",
                "",
                provenance(result, __file__),
                "",
                table(["`on_nonfinite_loss`", "ms per step", "difference (µs)", "vs. no check"], rows),
            ]
        )
        + "\n"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser(__file__, __doc__, write_docs=heading_target(SECTION))
    parser.add_argument("--rounds", type=int, default=15, help="rounds of one segment of each variant")
    parser.add_argument("--steps", type=int, default=100, help="steps per segment")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = parse_args(build_parser(), argv)

    def measure() -> dict[str, list[float]]:
        print(f"2 processes, gloo, {args.rounds} rounds of {args.steps}-step segments; medians:")
        with tempfile.TemporaryDirectory() as tmp:
            out = str(Path(tmp) / "times.json")
            mp.spawn(worker, args=(29000 + os.getpid() % 1000, args.rounds, args.steps, out), nprocs=2)
            times: dict[str, list[float]] = json.loads(Path(out).read_text())
        return times

    result = run_or_report(args, __file__, measure)
    print("\n".join(lines(result["figures"])))
    if args.write_docs:
        write_section(render(result))


if __name__ == "__main__":
    main()
