"""python benchmarks/async_save.py --write-docs

Background saves: how long FSDP2Strategy(async_save=True) keeps the training thread from training, against a synchronous sharded save of the same state, as paired ratios in one job.

Run it from the repository root; without ``--write-docs`` it prints the section and leaves
docs/benchmarks.md ("Background saves") alone. It takes about 2 minutes on 2 cores and needs
about 3 GB of memory and 1 GB of disk.

One job of 2 processes (CPU, gloo, one intra-op thread each) builds the model of
benchmarks/checkpoint.py (8 blocks of ``Linear(2048, 2048)``: 33.6M parameters) under
``FSDP2Strategy(auto_wrap_policy={Block}, state_dict_type="sharded", empty_init=True)`` and trains
one AdamW step, so that each rank holds a 201 MB shard of model and optimizer state. Then, for
each of ``--pairs`` rounds, in an order that alternates between rounds:

sync
    ``trainer.save_checkpoint(path)`` with ``async_save=False``: the whole save blocks training.
async
    ``trainer.save_checkpoint(path)`` with ``async_save=True``, then one training step (forward,
    backward, ``optimizer.step()``). Blocked: the time in ``save_checkpoint`` plus the time that
    step's ``optimizer.step()`` waited for the background copy of the parameters and optimizer
    state (``PendingSave.copy_wait_s``). The step's own time is recorded too: the copy runs
    beside its forward and backward, on the same 2 cores.
async, copied at the save
    the same, with every tensor copied inside ``save_checkpoint`` (on the training thread), as
    ``async_save`` did before the copy moved to the background thread; the rest as in "async"
    (before, the check for non-finite weights and two more collectives ran there too).

Every timing starts after a barrier and an ``os.sync`` (earlier saves' writeback is not this
one's cost); each rank times itself and the round's figure is the slower rank's. One untimed
sync and async save come first (the first background save creates its gloo group). After each
async save the job waits for its commit before the next timing. The ratio of a round is its
async blocked time over its sync save's time; the section shows the median and range of the
rounds' ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from _common import (
    REPO,
    heading_target,
    load_average,
    make_parser,
    parse_args,
    provenance,
    ratio_summary,
    run_or_report,
    table,
    worker_env,
    write_section,
)
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import fullshard
from fullshard.checkpoint import staging
from fullshard.strategies import FSDP2Strategy

SECTION = "## Background saves"
TARGET = 0.10  # training blocked by an async save at most this times a sync sharded save
WORLD_SIZE = 2
RUN_TIMEOUT_S = 900
MB = 1e6
VARIANTS = ("sync", "async", "async_at_save")


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


class Model(fullshard.Module):
    def __init__(self, depth: int, width: int) -> None:
        super().__init__()
        self.depth, self.width = depth, width
        self.blocks: nn.Sequential | None = None

    def configure_model(self) -> None:
        self.blocks = nn.Sequential(*(Block(self.width) for _ in range(self.depth)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.blocks is not None
        return self.blocks(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


# ---------------------------------------------------------------------------------------------
# The worker: both ranks of one job (the Trainer starts rank 1 from the same command).


class Job:
    def __init__(self, args: argparse.Namespace) -> None:
        self.root = Path(args.dir)
        self.strategy = FSDP2Strategy(auto_wrap_policy={Block}, state_dict_type="sharded", empty_init=True)
        self.trainer = fullshard.Trainer(
            accelerator="cpu",
            devices=WORLD_SIZE,
            strategy=self.strategy,
            max_steps=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=self.root,
        )
        data = torch.randn(4 * WORLD_SIZE, args.width, generator=torch.Generator().manual_seed(0))
        self.trainer.fit(Model(args.depth, args.width), DataLoader(TensorDataset(data), batch_size=4))
        assert self.strategy.model is not None
        self.model: nn.Module = self.strategy.model
        (self.optimizer,) = self.trainer.optimizers
        self.data = torch.randn(4, args.width, generator=torch.Generator().manual_seed(1))
        self.rows: dict[str, list[float]] = {}
        self.staged_mb = 0.0

    def step(self) -> float:
        start = time.perf_counter()
        self.model(self.data).pow(2).mean().backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        return time.perf_counter() - start

    def record(self, key: str, seconds: float) -> None:
        """The slower rank's ``seconds`` (a collective)."""
        both: list[float] = [0.0] * WORLD_SIZE
        dist.all_gather_object(both, seconds)
        self.rows.setdefault(key, []).append(max(both))

    def settle(self) -> None:
        os.sync()
        dist.barrier()

    def sync_save(self, index: int) -> None:
        self.strategy.async_save = False
        self.settle()
        start = time.perf_counter()
        self.trainer.save_checkpoint(self.root / f"sync-{index}")
        self.record("sync", time.perf_counter() - start)

    def async_save(self, index: int, key: str) -> None:
        self.strategy.async_save = True
        self.settle()
        start = time.perf_counter()
        self.trainer.save_checkpoint(self.root / f"{key}-{index}")
        in_call = time.perf_counter() - start
        pending = self.trainer.checkpoint_manager.pending
        assert pending is not None
        self.staged_mb = pending.staged_bytes / MB
        step = self.step()
        waited = pending.copy_wait_s
        self.trainer.checkpoint_manager.wait()
        self.strategy.async_save = False
        self.record(key, in_call + waited)
        self.record(f"{key}/in_call", in_call)
        self.record(f"{key}/waited", waited)
        self.record(f"{key}/step", step)

    def quiet_steps(self) -> None:
        self.settle()
        self.record("quiet_step", statistics.median(self.step() for _ in range(3)))

    def round(self, index: int) -> None:
        calls = {
            "sync": lambda: self.sync_save(index),
            "async": lambda: self.async_save(index, "async"),
            "async_at_save": lambda: self.at_save(index),
        }
        order = VARIANTS if index % 2 == 0 else VARIANTS[::-1]
        for key in order:
            calls[key]()
        self.quiet_steps()
        self.clean()

    def at_save(self, index: int) -> None:
        """``async_save`` with every tensor copied inside ``save_checkpoint`` (the design before)."""
        deferred = staging.changed_only_by_steps
        staging.changed_only_by_steps = lambda module, where="state": lambda key: False  # type: ignore[assignment]
        try:
            self.async_save(index, "async_at_save")
        finally:
            staging.changed_only_by_steps = deferred  # type: ignore[assignment]

    def clean(self) -> None:
        dist.barrier()
        if self.trainer.global_rank == 0:
            for path in self.root.iterdir():
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        dist.barrier()


def run_worker(args: argparse.Namespace) -> None:
    job = Job(args)
    job.sync_save(-1)  # untimed: the first background save also creates its process group
    job.async_save(-1, "warm-up")
    job.clean()
    job.rows.clear()
    for index in range(args.pairs):
        job.round(index)
        if job.trainer.global_rank == 0:
            line = "  ".join(f"{key} {values[-1]:.3f}" for key, values in job.rows.items() if "/" not in key)
            print(f"round {index + 1}/{args.pairs}: {line}", flush=True)
    if job.trainer.global_rank == 0:
        result = {"rows": job.rows, "staged_mb": job.staged_mb, "torch": torch.__version__}
        Path(args.out).write_text(json.dumps(result))


# ---------------------------------------------------------------------------------------------
# The driver: one job, then the section.


def run_job(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    out = work / "result.json"
    ckpts = work / "checkpoints"
    ckpts.mkdir(parents=True)
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        "--out",
        str(out),
        "--dir",
        str(ckpts),
    ]
    command += ["--pairs", str(args.pairs), "--depth", str(args.depth), "--width", str(args.width)]
    load = load_average()
    started = time.perf_counter()
    # 2 processes on 2 cores: one intra-op thread each. Rank 1 inherits this environment.
    done = subprocess.run(
        command, env=worker_env(threads=1), cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    if done.returncode != 0:
        raise RuntimeError(f"the benchmark job failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    print(done.stdout, end="", flush=True)
    result: dict[str, Any] = json.loads(out.read_text())
    result.update(load=load, wall_s=time.perf_counter() - started)
    return result


def paired(result: dict[str, Any], key: str) -> list[float]:
    rows = result["rows"]
    return [a / s for a, s in zip(rows[key], rows["sync"], strict=True)]


def render(saved: dict[str, Any]) -> str:
    """The section of docs/benchmarks.md, from a result (the job's figures, saved)."""
    result, args = saved["figures"], argparse.Namespace(**saved["arguments"])
    rows = result["rows"]

    def ms(key: str) -> str:
        return f"{statistics.median(rows[key]) * 1000:.0f} ms"

    ratios = paired(result, "async")
    before = paired(result, "async_at_save")
    verdict = "met" if statistics.median(ratios) <= TARGET else "missed"
    quiet = statistics.median(rows["quiet_step"])
    body = table(
        ["Per save (median of the rounds)", "sync", "async", "async, copied at the save"],
        [
            [
                "Training thread blocked (in `save_checkpoint` + the next step's wait)",
                ms("sync"),
                ms("async"),
                ms("async_at_save"),
            ],
            ["... of it in `save_checkpoint`", ms("sync"), ms("async/in_call"), ms("async_at_save/in_call")],
            [
                "... of it waiting in the next `optimizer.step()`",
                "",
                ms("async/waited"),
                ms("async_at_save/waited"),
            ],
            ["The next training step, the copy beside it", "", ms("async/step"), ms("async_at_save/step")],
        ],
    )
    return "\n".join(
        [
            SECTION,
            "",
            f"`{saved['command']}` ({saved['date']}, {saved['cores']} cores ({saved['machine']}), {saved['cpu']},"
            f" torch {result['torch']}, 1-minute load "
            f"{result['load']:.2f} at the start; {result['wall_s']:.0f} s). 2 CPU processes, gloo, FSDP2, "
            f"{args.depth} x `Linear({args.width}, {args.width})` + AdamW: {result['staged_mb']:.0f} MB of model and "
            f"optimizer state per rank; {args.pairs} rounds, each rank timing itself, the slower rank's time.",
            "",
            provenance(saved, __file__),
            "",
            body,
            "",
            f"Training blocked by an async save, over the sync save of the same round: "
            f"{ratio_summary(ratios, 'rounds')}. With the copy made inside `save_checkpoint`: "
            f"{ratio_summary(before, 'rounds')}. A training step with no save: {quiet * 1000:.0f} ms.",
            "",
            f"Target, training blocked by an async save at most {TARGET:.2f}x a sync sharded save: "
            f"{statistics.median(ratios):.3f}x, {verdict}.",
        ]
    )


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser(__file__, __doc__, write_docs=heading_target(SECTION))
    parser.add_argument("--pairs", type=int, default=6, help="rounds of the three saves (default 6)")
    parser.add_argument("--depth", type=int, default=8, help="number of blocks (default 8)")
    parser.add_argument("--width", type=int, default=2048, help="features of each Linear (default 2048)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parse_args(parser, argv)
    if args.worker:  # rank 0 here; its Trainer runs the same command for rank 1
        if not (args.out and args.dir):
            parser.error("--worker needs --out FILE and --dir DIR")
        run_worker(args)
        return
    import tempfile

    def measure() -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="fullshard-async-save-") as work:
            return run_job(args, Path(work))

    section = render(run_or_report(args, __file__, measure))
    print(section)
    if args.write_docs:
        write_section(section)


if __name__ == "__main__":
    main()
