"""The loops own their state: the fit loop's Progress is the one record of where training is,
what a checkpoint's "loops" entry holds, and what the Trainer's counters read; nothing outside
trainer.py reaches into the Trainer's private members."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

import fullshard
from conftest import SCRIPTS, quiet_trainer
from fullshard.trainer.loops import Progress

sys.path.insert(0, str(SCRIPTS))
from train_mlp import MLP, make_data

SRC = Path(fullshard.__file__).parent
LOOP_KEYS = {"epoch", "global_step", "batches_that_stepped", "batches_in_epoch", "samples_in_epoch",
             "epoch_finished", "total_batch_idx", "data_seed"}  # fmt: skip


def test_progress_state_round_trips() -> None:
    # manual optimization: several optimizer steps (global_step) per batch that stepped
    progress = Progress(
        epoch=2, global_step=7, batches_in_epoch=3, batches_that_stepped=4, total_batch_idx=15
    )
    state = progress.state_dict(samples_in_epoch=48, data_seed=5)
    assert set(state) == LOOP_KEYS
    restored = Progress()
    restored.load_state_dict({**state, "world_size": 2})
    assert (restored.epoch, restored.global_step, restored.batches_in_epoch) == (2, 7, 3)
    assert restored.batches_that_stepped == 4 and restored.total_batch_idx == 15 and restored.data_seed == 5
    assert restored.saved_position is not None and restored.saved_position.samples == 48
    assert restored.saved_position.world_size == 2
    # an epoch cut short is saved at its cut, not at the epoch training moved on to
    progress.resume_point = (1, 4, 32)
    assert (
        progress.state_dict(None, 5)["epoch"] == 1 and progress.state_dict(None, 5)["batches_in_epoch"] == 4
    )


def test_trainer_counters_are_the_fit_loops_progress(tmp_path: Path) -> None:
    trainer = quiet_trainer(tmp_path, max_steps=5, limit_train_batches=0.5)
    trainer.fit(MLP(), DataLoader(make_data(), batch_size=16))
    progress = trainer.fit_loop.progress
    assert (trainer.global_step, trainer.current_epoch) == (progress.global_step, progress.epoch) == (5, 2)
    assert trainer.logger_step == progress.batches_that_stepped == 5
    assert (
        progress.total_batch_idx == 5
        and trainer.num_training_batches == trainer.fit_loop.num_training_batches
    )
    trainer.save_checkpoint(tmp_path / "a.ckpt")
    saved = torch.load(tmp_path / "a.ckpt", weights_only=True)["loops"]
    assert saved == trainer.fit_loop.state_dict()
    # the cut epoch (epoch 1, 2 of its 3 batches) is what resumes
    # inside an epoch: also what the epoch drew ([Note: the epoch's draws] in fullshard.trainer.data)
    assert set(saved) == LOOP_KEYS | {"epoch_rng_state", "epoch_order_state"}
    assert (saved["epoch"], saved["batches_in_epoch"]) == (1, 2)


def test_resume_restores_progress_into_the_fit_loop(tmp_path: Path) -> None:
    first = quiet_trainer(tmp_path, max_steps=4)
    first.fit(MLP(), DataLoader(make_data(), batch_size=16))
    first.save_checkpoint(tmp_path / "a.ckpt")
    second = quiet_trainer(tmp_path, max_steps=8)
    second.fit(MLP(), DataLoader(make_data(), batch_size=16), ckpt_path=tmp_path / "a.ckpt")
    assert second.global_step == 8 and second.fit_loop.progress.total_batch_idx == 8
    assert second.fit_loop.progress.pending is None and second.fit_loop.progress.saved_position is None


def test_no_module_outside_trainer_py_touches_trainer_private_members() -> None:
    private = re.compile(r"\btrainer\._[a-z]\w*|\bTrainer\._[a-z]\w*")
    offenders = [
        f"{path.relative_to(SRC)}:{n}: {line.strip()}"
        for path in sorted(SRC.rglob("*.py"))
        if path != SRC / "trainer" / "trainer.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if private.search(line.split("#")[0])
    ]
    assert not offenders, "\n".join(offenders)


class _FrozenDropout(MLP):
    """An MLP whose dropout layer the user froze in eval mode (as a frozen backbone's BatchNorm)."""

    def __init__(self) -> None:
        super().__init__(dropout=0.5)
        self.net[2].eval()
        self.modes: list[tuple[bool, bool]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.modes.append((self.net[0].training, self.net[2].training))
        return super().training_step(batch, batch_idx)


def test_training_keeps_the_modes_the_user_set_as_lightning(tmp_path: Path) -> None:
    # Lightning 2.x never calls .train() when fit or an epoch starts, and validation puts back
    # every submodule's mode: a frozen submodule stays in eval mode through training.
    model = _FrozenDropout()
    trainer = quiet_trainer(tmp_path, max_epochs=2, limit_train_batches=3, limit_val_batches=2)
    loader = DataLoader(make_data(), batch_size=16)
    trainer.fit(model, loader, loader)
    assert model.modes == [(True, False)] * 6
    assert model.net[0].training and not model.net[2].training
