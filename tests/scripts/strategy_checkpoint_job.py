"""python tests/scripts/strategy_checkpoint_job.py OUT

Two CPU processes (gloo), each with an ``FSDP2Strategy`` set up by hand, no Trainer: every
format (full; sharded; sharded written in the background) is saved with
``strategy.save_checkpoint``, training goes on, and ``strategy.load_checkpoint`` puts the saved
state back. Each rank writes what it saw to ``OUT/rank<r>.json``; used by
tests/test_checkpoint_without_trainer.py.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from torch import nn

from fullshard.launch.environments import LocalEnvironment
from fullshard.strategies import FSDP2Strategy

CASES = (("full", False), ("sharded", False), ("sharded", True))


def _step(model: nn.Module, strategy: FSDP2Strategy, optimizer: torch.optim.Optimizer) -> None:
    model(torch.randn(4, 8)).sum().backward()
    strategy.optimizer_step(optimizer)
    optimizer.zero_grad()


def _whole(strategy: FSDP2Strategy, optimizer: torch.optim.Optimizer) -> dict[str, list[float]]:
    """The whole model and optimizer state (gathered: the same on every rank), as numbers."""
    model_state, optimizer_states = strategy.get_state([optimizer], full=True)
    moments = {f"{k}.exp_avg": v["exp_avg"] for k, v in optimizer_states[0]["state"].items()}
    return {k: v.flatten().tolist() for k, v in {**model_state, **moments}.items()}


def case(out: Path, fmt: str, background: bool) -> dict[str, Any]:
    torch.manual_seed(5)
    strategy = FSDP2Strategy(state_dict_type=fmt, async_save=background)
    strategy.configure(
        devices=[torch.device("cpu")] * 2,
        num_nodes=1,
        cluster_environment=LocalEnvironment(),
        precision="32-true",
    )
    strategy.setup_environment()
    model = strategy.setup_module(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
    optimizer = strategy.setup_optimizer(torch.optim.AdamW(model.parameters(), lr=0.1))
    _step(model, strategy, optimizer)
    saved = _whole(strategy, optimizer)
    path = out / f"{fmt}-{background}"
    loops = {"epoch": 0, "global_step": 1, "batches_that_stepped": 1, "batches_in_epoch": 1}
    checkpoint = {"loops": loops, "lr_schedulers": [], "by_hand": 7}
    strategy.save_checkpoint(checkpoint, path, optimizers=[optimizer])
    assert strategy.checkpointer is not None
    pending = strategy.checkpointer.pending is not None
    _step(model, strategy, optimizer)  # training goes on (after the copy, with a background save)
    changed = _whole(strategy, optimizer) != saved
    rest = strategy.load_checkpoint(path, [optimizer])
    return {
        "pending_after_save": pending,
        "changed_by_training": changed,
        "restored": _whole(strategy, optimizer) == saved,
        "by_hand": rest["by_hand"],
        "format": "directory" if path.is_dir() else "file",
    }


def worker(rank: int, out: Path, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    seen = {f"{fmt}-{background}": case(out, fmt, background) for fmt, background in CASES}
    (out / f"rank{rank}.json").write_text(json.dumps(seen))
    torch.distributed.destroy_process_group()


def main() -> None:
    out = Path(sys.argv[1])
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.start_processes(worker, args=(out, port), nprocs=2, start_method="fork")


if __name__ == "__main__":
    main()
