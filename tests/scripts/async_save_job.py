"""FSDP2 on 2 CPU processes saving sharded checkpoints in the background (async_save=True);
used by tests/test_async_save.py. Each rank writes what it saw to ``OUT/rank<r>.json``.

python tests/scripts/async_save_job.py --out DIR --path CKPT --save-at 3,5 --max-steps 6
python tests/scripts/async_save_job.py --out DIR --path CKPT --save-at 3,5 --kill 1:sharded.data_written:2
python tests/scripts/async_save_job.py --out DIR --path CKPT --save-at 3,4 --fail 1:2 --max-steps 8
python tests/scripts/async_save_job.py --out DIR --path CKPT --save-at 3,4 --fail-copy 1:2 --max-steps 8
python tests/scripts/async_save_job.py --out DIR --path A --save-at 3 --sync-copy S --slow 1 --after-fit B

--kill RANK:POINT:N  SIGKILL rank RANK the Nth time it reaches save point POINT
--fail RANK:N        rank RANK's writer raises OSError(ENOSPC) in the Nth save
--fail-copy RANK:N   rank RANK's copy of the state to host memory raises MemoryError in the Nth save
--slow SECONDS       the first background save's writer sleeps that long (training goes on)
--sync-copy PATH     at the first save step, also save synchronously to PATH and the full state
                     to OUT/reference.pt (before the background save, which then starts)
--after-fit PATH     after fit: a save to PATH; one whose writer fails (rank 0); one more, which
                     raises that failure; and a last, slow one, that the process exit waits for
"""

from __future__ import annotations

import argparse
import atexit
import errno
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import torch
from ckpt_job import Block, Net, make_data  # beside this script, on sys.path
from torch.utils.data import DataLoader

import fullshard
from fullshard.checkpoint.events import set_event_hook
from fullshard.checkpoint.tools import inspect
from fullshard.errors import CheckpointError
from fullshard.strategies import FSDP2Strategy

RANK = int(os.environ.get("LOCAL_RANK", "0"))
LOG: dict[str, Any] = {"events": [], "errors": [], "saves": [], "inspections": []}
TRAINER: list[fullshard.Trainer] = []


def step() -> int:
    return TRAINER[0].global_step if TRAINER else -1


def write_log(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".rank{RANK}.json"
    tmp.write_text(json.dumps(LOG))
    tmp.replace(out / f"rank{RANK}.json")


class Faults:
    """The event hook: records every save point reached, and slows, fails or kills as asked."""

    def __init__(self, kill: str | None, fail: str | None, slow: float, fail_copy: str | None = None) -> None:
        self.counts: dict[str, int] = {}
        self.kill = kill.split(":") if kill else None
        self.fail_save = int(fail.split(":")[1]) if fail and int(fail.split(":")[0]) == RANK else 0
        self.fail_copy = (
            int(fail_copy.split(":")[1]) if fail_copy and int(fail_copy.split(":")[0]) == RANK else 0
        )
        self.slow = slow
        self.lock = threading.Lock()

    def __call__(self, point: str) -> None:
        with self.lock:
            n = self.counts[point] = self.counts.get(point, 0) + 1
            LOG["events"].append([point, n, step(), threading.current_thread().name, time.monotonic()])
        if self.kill and int(self.kill[0]) == RANK and point == self.kill[1] and n == int(self.kill[2]):
            os.kill(os.getpid(), signal.SIGKILL)
        if point == "async.writing" and self.slow:  # before the writer reads the staged copy
            slow, self.slow = self.slow, 0.0  # the next background save only
            time.sleep(slow)
        if point == "sharded.data_written" and n == self.fail_save:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if point == "async.copying" and n == self.fail_copy:
            raise MemoryError("cannot allocate the host copy")


def shard_bytes(trainer: fullshard.Trainer) -> tuple[int, int]:
    """This rank's bytes of model and optimizer state, and the whole state's (every rank's)."""
    from torch.distributed.tensor import DTensor

    model_state, optimizer_states = trainer.strategy.get_state(trainer.optimizers, full=False)
    tensors = [
        *model_state.values(),
        *(v for s in optimizer_states for p in s["state"].values() for v in p.values()),
    ]
    local = whole = 0
    for t in tensors:
        if isinstance(t, DTensor):
            local += t.to_local().numel() * t.element_size()
            whole += t.numel() * t.element_size()
        elif isinstance(t, torch.Tensor):
            local += t.numel() * t.element_size()
            whole += t.numel() * t.element_size()
    return local, whole


def save(trainer: fullshard.Trainer, path: str, label: str) -> None:
    LOG["events"].append([f"save_called:{label}", 0, step(), "main", time.monotonic()])
    trainer.save_checkpoint(path)
    pending = trainer.checkpoint_manager.pending
    local, whole = shard_bytes(trainer)
    deferred = pending._staging.deferred if pending else None  # values the writer thread copies
    parameters = len(list(trainer.lightning_module.parameters()))
    LOG["saves"].append(
        {
            "label": label,
            "step": step(),
            "staged": pending.staged_bytes if pending else None,
            "shard": local,
            "whole": whole,
            "deferred": deferred,
            "parameters": parameters,
        }
    )
    LOG["events"].append([f"save_returned:{label}", 0, step(), "main", time.monotonic()])


def inspection(path: str) -> dict[str, Any]:
    report = inspect(path, verify_checksums=True)
    record = json.loads((Path(path) / "fullshard-checkpoint.json").read_text())
    return {
        "complete": report.complete,
        "verified": report.verified,
        "global_step": report.global_step,
        "data": record["data"],
    }


def record_error(err: BaseException, where: str) -> None:
    LOG["errors"].append({"where": where, "type": type(err).__name__, "message": str(err), "step": step()})


class Saver(fullshard.Callback):
    def __init__(self, args: argparse.Namespace, out: Path) -> None:
        self.args = args
        self.out = out
        self.at = [int(s) for s in args.save_at.split(",") if s]

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step not in self.at:
            return
        if self.args.sync_copy and trainer.global_step == self.at[0]:
            model_state, optimizer_states = trainer.strategy.get_state(trainer.optimizers, full=True)
            if trainer.is_global_zero:
                torch.save({"model": model_state, "optimizers": optimizer_states}, self.out / "reference.pt")
            trainer.strategy.async_save = False  # the same state, saved the synchronous way
            save(trainer, self.args.sync_copy, "sync")
            trainer.strategy.async_save = True
        save(trainer, self.args.path, f"step{trainer.global_step}")

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        record_error(exception, "fit")
        write_log(self.out)
        if RANK == 0:  # the launcher ends the other ranks once rank 0 fails: let rank 1 report first
            deadline = time.monotonic() + 30
            while not (self.out / "rank1.json").exists() and time.monotonic() < deadline:
                time.sleep(0.05)


def after_fit(trainer: fullshard.Trainer, path: str, faults: Faults) -> None:
    save(trainer, path, "after_fit_ok")
    trainer.checkpoint_manager.wait()
    LOG["inspections"].append(["before_failure", inspection(path)])
    saves = faults.counts.get("sharded.data_written", 0)
    if RANK == 0:
        faults.fail_save = saves + 1
    save(trainer, path, "after_fit_failing")
    try:
        save(trainer, path, "after_fit_raises")
    except CheckpointError as err:
        record_error(err, "next_save")
    LOG["inspections"].append(["after_failure", inspection(path)])
    faults.slow = 1.0  # the process exits while this save's files are being written
    save(trainer, path, "at_exit")
    LOG["events"].append(["main_returns", 0, step(), "main", time.monotonic()])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--path", required=True)
    p.add_argument("--save-at", default="3")
    p.add_argument("--max-steps", type=int, default=6)
    p.add_argument("--sync-copy", default=None)
    p.add_argument("--slow", type=float, default=0.0)
    p.add_argument("--kill", default=None)
    p.add_argument("--fail", default=None)
    p.add_argument("--fail-copy", default=None)
    p.add_argument("--after-fit", default=None)
    p.add_argument("--model-checkpoint", default=None, help="also a ModelCheckpoint(every_n_train_steps=N)")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atexit.register(write_log, out)  # registered first, so it runs last: after the exit waited for saves

    faults = Faults(args.kill, args.fail, args.slow, args.fail_copy)
    set_event_hook(faults)
    fullshard.seed_everything(11)
    callbacks: list[Any] = [Saver(args, out)]
    if args.model_checkpoint:
        callbacks.append(
            fullshard.ModelCheckpoint(
                dirpath=out / "mc", every_n_train_steps=int(args.model_checkpoint), save_top_k=1
            )
        )
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=FSDP2Strategy(auto_wrap_policy={Block}, state_dict_type="sharded", async_save=True),
        max_steps=args.max_steps,
        logger=False,
        enable_checkpointing=bool(args.model_checkpoint),
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        default_root_dir=out,
    )
    TRAINER.append(trainer)
    trainer.fit(Net(), DataLoader(make_data(), batch_size=8, shuffle=True))
    LOG["events"].append(["fit_returned", 0, step(), "main", time.monotonic()])
    LOG["pending_after_fit"] = trainer.checkpoint_manager.pending is not None
    if args.after_fit:
        after_fit(trainer, args.after_fit, faults)


if __name__ == "__main__":
    main()
