"""Shared helpers for the checkpoint tests: in-process runs of the ``ckpt_job`` model."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

import fullshard
from conftest import SCRIPTS, check_ok, has_checkpoint_callback, run_script
from fullshard.checkpoint.events import set_event_hook
from fullshard.strategies import SingleDeviceStrategy

sys.path.insert(0, str(SCRIPTS))
from ckpt_job import Net, make_data


def run_single(
    root: Path,
    *,
    fmt: str = "full",
    max_steps: int = 4,
    resume: Path | str | None = None,
    save: Path | None = None,
    model: Net | None = None,
    **trainer_kwargs: Any,
) -> tuple[fullshard.Trainer, Net]:
    """Train ``Net`` in this process (single device), optionally resuming and saving."""
    fullshard.seed_everything(11)
    model = model if model is not None else Net()
    checkpointing = has_checkpoint_callback(trainer_kwargs.get("callbacks"))
    kwargs: dict[str, Any] = dict(logger=False, enable_checkpointing=checkpointing, enable_progress_bar=False)
    kwargs.update(trainer_kwargs)
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=1,
        strategy=SingleDeviceStrategy(state_dict_type=fmt),
        max_steps=max_steps,
        default_root_dir=root,
        **kwargs,
    )
    trainer.fit(model, DataLoader(make_data(), batch_size=8, shuffle=True), ckpt_path=resume)
    if save is not None:
        trainer.save_checkpoint(save)
    return trainer, model


def run_scenarios(root: Path, runs: list[list[str]], devices: int = 2, timeout: float = 300) -> None:
    """Several tests/scripts/ckpt_job.py runs (argument lists) in turn, in one job of ``devices``
    processes: one start-up and process group for all (each run has its own --out)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "runs.json").write_text(json.dumps(runs))
    args = ["--scenarios", str(root / "runs.json"), "--devices", str(devices)]
    check_ok(run_script("ckpt_job.py", *args, timeout=timeout))


def full_state(trainer: fullshard.Trainer) -> dict[str, Any]:
    model_state, optimizer_states = trainer.strategy.get_state(trainer.optimizers, full=True)
    return {"model": model_state, "optimizers": optimizer_states}


def assert_same_state(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Model tensors and optimizer state tensors are bitwise equal."""
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert len(a["optimizers"]) == len(b["optimizers"])
    for oa, ob in zip(a["optimizers"], b["optimizers"], strict=True):
        assert oa["state"].keys() == ob["state"].keys()
        for fqn, state in oa["state"].items():
            for name, value in state.items():
                assert torch.equal(torch.as_tensor(value), torch.as_tensor(ob["state"][fqn][name])), (
                    fqn,
                    name,
                )


def killed_at(point: str, work: Callable[[], object], nth: int = 1, timeout: float = 60) -> None:
    """Run ``work`` in a forked child of this process that SIGKILLs itself the ``nth`` time a
    checkpoint save reaches ``point`` (see fullshard.checkpoint.events); fail unless the child
    died of that SIGKILL.

    The same kill as a multi-process job's (tests/scripts/ckpt_job.py --fault), at world size 1,
    without starting an interpreter: the save stops dead, none of its ``finally``/``except``
    cleanup runs (an exception raised at the point would let that run, and prove less).
    """
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        try:
            torch.set_num_threads(1)  # OpenMP's worker threads do not survive the fork
            seen = 0

            def hook(reached: str) -> None:
                nonlocal seen
                seen += reached == point
                if reached == point and seen == nth:
                    os.kill(os.getpid(), signal.SIGKILL)

            set_event_hook(hook)
            work()
        except BaseException:
            traceback.print_exc()  # into the test's captured output
        finally:
            os._exit(1)
    deadline = time.monotonic() + timeout
    while (waited := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"the child saving until {point!r} still ran after {timeout} s")
        time.sleep(0.02)
    status = waited[1]
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
        f"the save never reached {point!r} (#{nth}): the child ended with wait status {status}"
    )
