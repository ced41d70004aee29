"""A strategy saves and loads checkpoints without a Trainer: Lightning's ``strategy.save_checkpoint``
and ``strategy.load_checkpoint`` on a strategy set up by hand go through the checkpoint engine, by
the strategy's own :class:`~fullshard.checkpoint.checkpointer.Checkpointer`: in one process
(SingleDeviceStrategy), and on 2 gloo processes with FSDP2 (tests/scripts/strategy_checkpoint_job.py).

Run: pytest tests/test_checkpoint_without_trainer.py
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from conftest import check_ok, run_script
from fullshard.checkpoint.events import set_event_hook
from fullshard.checkpoint.tools import inspect
from fullshard.strategies import SingleDeviceStrategy

# DCP's note when it saves without a process group (one process)
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled, unavailable or uninitialized")


@pytest.fixture(autouse=True)
def _no_hook() -> Iterator[None]:
    yield
    set_event_hook(None)


def _set_up(fmt: str) -> tuple[SingleDeviceStrategy, nn.Module, torch.optim.Optimizer]:
    """A strategy set up as a host other than the Trainer would: environment, module, optimizer,
    and one training step (so the optimizer has state to save)."""
    torch.manual_seed(3)
    strategy = SingleDeviceStrategy(state_dict_type=fmt)
    strategy.setup_environment()
    model = strategy.setup_module(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))
    optimizer = strategy.setup_optimizer(torch.optim.AdamW(model.parameters(), lr=0.1))
    model(torch.randn(5, 4)).sum().backward()
    strategy.optimizer_step(optimizer)
    return strategy, model, optimizer


def _resumable(step: int) -> dict[str, Any]:
    """What a checkpoint that also restores optimizers records beside the tensors (a load checks
    them first): the loop position and the schedulers' states, here of a host of its own."""
    loops = {"epoch": 0, "global_step": step, "batches_that_stepped": step, "batches_in_epoch": step}
    return {"loops": loops, "lr_schedulers": []}


@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_a_strategy_set_up_by_hand_saves_and_loads(tmp_path: Path, fmt: str) -> None:
    strategy, model, optimizer = _set_up(fmt)
    saved_model = {k: v.clone() for k, v in model.state_dict().items()}
    saved_moments = [s["exp_avg"].clone() for s in optimizer.state.values()]
    path = tmp_path / "ckpt"
    strategy.save_checkpoint({**_resumable(1), "by_hand": 7}, path, optimizers=[optimizer])
    assert strategy.checkpointer is not None and strategy.checkpointer.pending is None  # written at once
    assert (path.is_dir(), inspect(path, verify_checksums=True).complete) == (fmt == "sharded", True)

    model(torch.randn(5, 4)).sum().backward()  # training goes on: parameters and moments change
    strategy.optimizer_step(optimizer)
    assert not torch.equal(model.state_dict()["0.weight"], saved_model["0.weight"])

    rest = strategy.load_checkpoint(path, [optimizer])
    assert rest["by_hand"] == 7 and rest["loops"]["global_step"] == 1
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, saved_model[key], rtol=0, atol=0)
    for state, moment in zip(optimizer.state.values(), saved_moments, strict=True):
        torch.testing.assert_close(state["exp_avg"], moment, rtol=0, atol=0)
    # a second strategy loads the first one's checkpoint: the format is the one a Trainer writes
    other, other_model, _ = _set_up("full")
    other.load_checkpoint(path, weights_only=True)
    torch.testing.assert_close(other_model.state_dict(), saved_model, rtol=0, atol=0)


def test_a_background_save_without_a_trainer_is_owned_by_the_strategy(tmp_path: Path) -> None:
    """``async_save`` without a Trainer: the strategy's own checkpointer keeps the save being written
    and waits for it before the next load, as the Trainer's does."""
    strategy, model, optimizer = _set_up("sharded")
    strategy.async_save = True
    release = threading.Event()

    def hold(point: str) -> None:  # the writer waits until the test lets it go
        if point == "async.copied":
            assert release.wait(30)

    set_event_hook(hold)
    path = tmp_path / "ckpt"
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    strategy.save_checkpoint(_resumable(1), path, optimizers=[optimizer])
    checkpointer = strategy.checkpointer
    assert checkpointer is not None and checkpointer.pending is not None
    assert checkpointer.background.unfinished() == [checkpointer.pending]
    release.set()
    strategy.load_checkpoint(path, [optimizer])  # waits for the save first: it loads what it wrote
    assert checkpointer.pending is None and checkpointer.background.unfinished() == []
    torch.testing.assert_close(model.state_dict(), saved, rtol=0, atol=0)


@pytest.mark.multiprocess
def test_two_processes_with_strategies_set_up_by_hand_save_and_load(tmp_path: Path) -> None:
    """FSDP2 on 2 gloo processes, no Trainer: each format (full, sharded, sharded in the
    background) saved by ``strategy.save_checkpoint`` and loaded back by ``load_checkpoint``
    (tests/scripts/strategy_checkpoint_job.py)."""
    check_ok(run_script("strategy_checkpoint_job.py", str(tmp_path), timeout=240))
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen == {
            f"{fmt}-{background}": {
                "pending_after_save": background,
                "changed_by_training": True,
                "restored": True,
                "by_hand": 7,
                "format": "directory" if fmt == "sharded" else "file",
            }
            for fmt, background in (("full", False), ("sharded", False), ("sharded", True))
        }
