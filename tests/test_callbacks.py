"""EarlyStopping, LearningRateMonitor and ModelCheckpoint.

Three parts: unit tests of each callback's rules on a small fake trainer; end-to-end runs on a
real one-process Trainer whose expected results were recorded from Lightning 2.6.6 running the
same scenario (the same module, data sizes and scripted metrics, see ``_Scripted``); and a
two-process run checking that a stop asked for by one rank stops every rank together.
"""

from __future__ import annotations

import builtins
import contextlib
import math
import os
import warnings
from collections.abc import Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import fullshard
from conftest import quiet_trainer
from fullshard.errors import MisconfigurationError
from fullshard.optimizer_config import LRSchedulerConfig
from fullshard.trainer.callbacks import model_checkpoint as mc_module
from fullshard.trainer.callbacks.early_stopping import EarlyStopping, EarlyStoppingReason
from fullshard.trainer.callbacks.lr_monitor import LearningRateMonitor
from fullshard.trainer.callbacks.model_checkpoint import ModelCheckpoint
from fullshard.trainer.loggers.base import Logger
from fullshard.trainer.loggers.csv_logger import CSVLogger


# ================================================================================ fake trainer
class _Strategy:
    """Single process, but ``other_votes`` stand for what the other ranks decide."""

    def __init__(self, other_votes: tuple[bool, ...] = ()) -> None:
        self.root_device = torch.device("cpu")
        self.other_votes = other_votes
        self.reductions: list[tuple[bool, bool]] = []

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return obj

    def barrier(self, name: str | None = None) -> None:
        pass

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        self.reductions.append((decision, all))
        votes = [decision, *self.other_votes]
        return builtins.all(votes) if all else any(votes)


def _fake(tmp_path: Path, **attributes: Any) -> Any:
    """A trainer with the attributes the callbacks read; ``save_checkpoint`` writes a small file
    and records (name, weights_only, files in the directory before the write)."""
    saved: list[tuple[str, bool, list[str]]] = []
    trainer = SimpleNamespace(
        strategy=_Strategy(),
        # nothing written in the background: the caller acts now
        checkpoint_manager=SimpleNamespace(after_commit=lambda action: False),
        is_global_zero=True,
        global_rank=0,
        world_size=1,
        sanity_checking=False,
        fast_dev_run=0,
        ckpt_path=None,
        should_stop=False,
        callback_metrics={},
        global_step=0,
        current_epoch=0,
        optimizers=[],
        lr_scheduler_configs=[],
        loggers=[],
        default_root_dir=str(tmp_path),
        num_val_batches=[2],
        val_check_interval=1.0,
        check_val_every_n_epoch=1,
        is_last_batch=False,
        logger_step=0,
        log_every_n_steps=1,
        saved=saved,
    )

    def save_checkpoint(filepath: str, weights_only: bool = False) -> None:
        folder = Path(filepath).parent
        saved.append((os.path.relpath(filepath, tmp_path), weights_only, _files(folder)))
        folder.mkdir(parents=True, exist_ok=True)
        Path(filepath).write_text(f"step {trainer.global_step}")

    trainer.save_checkpoint = save_checkpoint
    for name, value in attributes.items():
        setattr(trainer, name, value)
    return trainer


@contextlib.contextmanager
def warnings_recorded() -> Iterator[list[warnings.WarningMessage]]:
    """Record every warning raised inside the block."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


def _files(folder: Path) -> list[str]:
    if not folder.is_dir():
        return []
    return sorted(p.name + ("->" + os.readlink(p) if p.is_symlink() else "") for p in folder.iterdir())


def _metrics(trainer: Any, **values: float) -> None:
    trainer.callback_metrics.update({k: torch.tensor(v) for k, v in values.items()})


def _start(cb: Any, trainer: Any, stage: str = "fit") -> None:
    cb.setup(trainer, None, stage)
    if stage == "fit":
        cb.on_train_start(trainer, None)


def _step(cb: ModelCheckpoint, trainer: Any, last: bool = False) -> None:
    trainer.global_step += 1
    trainer.is_last_batch = last
    cb.on_train_batch_end(trainer, None, {}, None, 0)


def _validate(cb: Any, trainer: Any, **values: float) -> None:
    _metrics(trainer, **values)
    cb.on_validation_end(trainer, None)


def _end_epoch(cb: Any, trainer: Any) -> None:
    cb.on_train_epoch_end(trainer, None)
    trainer.current_epoch += 1


# ====================================================================== ModelCheckpoint: names
@pytest.mark.parametrize(
    ("kwargs", "metrics", "expected"),
    [
        (
            {"filename": "{epoch}-{val_loss:.2f}"},
            {"epoch": 0, "val_loss": 0.123456},
            "epoch=0-val_loss=0.12.ckpt",
        ),
        ({}, {"epoch": 0, "step": 100}, "epoch=0-step=100.ckpt"),
        ({"filename": "{epoch:03d}"}, {"epoch": 5}, "epoch=005.ckpt"),
        ({"filename": "{missing:d}"}, {}, "missing=0.ckpt"),
        ({"filename": "{epoch}-{epoch_test}"}, {"epoch": 1, "epoch_test": 7}, "epoch=1-epoch_test=7.ckpt"),
        (
            {"filename": "{epoch}-{val/loss:.2f}"},
            {"epoch": 2, "val/loss": 0.123},
            "epoch=2-val/loss=0.12.ckpt",
        ),
        ({"filename": "{val.acc:.1f}"}, {"val.acc": torch.tensor(0.5)}, "val.acc=0.5.ckpt"),
        (
            {"filename": "epoch={epoch}-validation_loss={val_loss:.2f}", "auto_insert_metric_name": False},
            {"epoch": 2, "val_loss": 0.123456},
            "epoch=2-validation_loss=0.12.ckpt",
        ),
        ({"filename": "{step}"}, {"step": torch.tensor(3, dtype=torch.int32)}, "step=3.ckpt"),
    ],
)
def test_filename_templates_as_lightning(
    kwargs: dict[str, Any], metrics: dict[str, Any], expected: str
) -> None:
    assert ModelCheckpoint(**kwargs).format_checkpoint_name(metrics) == expected


def test_filename_version_prefix_and_directory(tmp_path: Path) -> None:
    cb = ModelCheckpoint(dirpath=tmp_path / "c", filename="{epoch}")
    assert cb.dirpath == os.path.realpath(tmp_path / "c")
    assert cb.format_checkpoint_name({"epoch": 1}, ver=2) == os.path.join(cb.dirpath, "epoch=1-v2.ckpt")
    assert cb.format_checkpoint_name({"epoch": 1}, prefix="run") == os.path.join(
        cb.dirpath, "run-epoch=1.ckpt"
    )
    assert cb.format_checkpoint_name({"epoch": 1}, filename="{epoch}-last") == os.path.join(
        cb.dirpath, "epoch=1-last.ckpt"
    )
    with pytest.raises(MisconfigurationError, match=r"cannot format 'val_loss' = 0.5 with \{val_loss:d\}"):
        ModelCheckpoint(filename="{val_loss:d}").format_checkpoint_name({"val_loss": 0.5})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mode": "best"}, r"ModelCheckpoint\(mode='best'\) is invalid: use 'min' or 'max'"),
        ({"save_top_k": -2}, r"ModelCheckpoint\(save_top_k=-2\) is invalid: use -1 \(keep all\), 0"),
        ({"save_top_k": True}, r"ModelCheckpoint\(save_top_k=True\) is invalid"),
        ({"every_n_epochs": -1}, r"ModelCheckpoint\(every_n_epochs=-1\) is invalid: use a positive int"),
        ({"every_n_train_steps": 1.5}, r"ModelCheckpoint\(every_n_train_steps=1.5\) is invalid"),
        (
            {"train_time_interval": 60},
            r"ModelCheckpoint\(train_time_interval=60\) is invalid: use a datetime",
        ),
        (
            {"save_last": "copy"},
            r"ModelCheckpoint\(save_last='copy'\) is invalid: use True, False, None or 'link'",
        ),
        ({"save_last": 1}, r"ModelCheckpoint\(save_last=1\) is invalid"),
        (
            {"save_weights_only": "yes"},
            r"ModelCheckpoint\(save_weights_only='yes'\) is invalid: use True or False",
        ),
        ({"save_on_train_epoch_end": 1}, r"ModelCheckpoint\(save_on_train_epoch_end=1\) is invalid"),
        ({"monitor": 3}, r"ModelCheckpoint\(monitor=3\) is invalid: use the name of a logged metric"),
        ({"filename": ""}, r"ModelCheckpoint\(filename=''\) is invalid: use a name template"),
        (
            {"dirpath": "s3://bucket/ckpts"},
            r"dirpath='s3://bucket/ckpts'\) is invalid: only local directories",
        ),
        (
            {"every_n_train_steps": 5, "every_n_epochs": 1},
            r"ModelCheckpoint\(every_n_train_steps=5, every_n_epochs=1\): pass only one of every_n_train_steps, "
            r"every_n_epochs and train_time_interval",
        ),
        (
            {"every_n_epochs": 2, "train_time_interval": timedelta(minutes=5)},
            r"every_n_epochs=2, train_time_interval=datetime.timedelta\(seconds=300\)\): pass only one",
        ),
    ],
)
def test_model_checkpoint_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(MisconfigurationError, match=match):
        ModelCheckpoint(**kwargs)


def test_triggers_default_and_state_key() -> None:
    assert (ModelCheckpoint().every_n_epochs, ModelCheckpoint().every_n_train_steps) == (1, 0)
    assert ModelCheckpoint(every_n_train_steps=5).every_n_epochs == 0
    # an explicit trigger, even 0, disables the default
    assert ModelCheckpoint(every_n_train_steps=0).every_n_epochs == 0
    assert ModelCheckpoint(train_time_interval=timedelta(0)).every_n_epochs == 0
    assert ModelCheckpoint(monitor="val_loss", every_n_train_steps=3).state_key == (
        "ModelCheckpoint{'monitor': 'val_loss', 'mode': 'min', 'every_n_train_steps': 3, 'every_n_epochs': 0, "
        "'train_time_interval': None}"
    )


# ==================================================================== ModelCheckpoint: triggers
def test_monitor_not_logged_yet_skips_step_saves_until_it_is(tmp_path: Path) -> None:
    """Validation once per epoch: checkpoints are taken at train epoch end, so a step save that
    finds no ``val_loss`` is skipped (no error, no warning) and the next step save after the first
    validation uses it."""
    trainer = _fake(tmp_path)
    cb = ModelCheckpoint(dirpath=tmp_path / "c", monitor="val_loss", every_n_train_steps=2, save_top_k=2)
    _start(cb, trainer)
    with warnings_recorded() as caught:
        for i in range(6):
            _step(cb, trainer, last=i == 5)
        _validate(cb, trainer, val_loss=3.0)
        _end_epoch(cb, trainer)
    assert trainer.saved == [] and caught == []
    _step(cb, trainer)
    _step(cb, trainer)
    assert [name for name, _, _ in trainer.saved] == ["c/epoch=1-step=8.ckpt"]
    assert cb.best_model_score == torch.tensor(3.0)


def test_step_save_waiting_for_the_metric_happens_after_validation(tmp_path: Path) -> None:
    trainer = _fake(tmp_path, val_check_interval=4)  # several validations per epoch: save after them
    cb = ModelCheckpoint(dirpath=tmp_path / "c", monitor="val_loss", every_n_train_steps=2, save_top_k=-1)
    _start(cb, trainer)
    for _ in range(4):
        _step(cb, trainer)
    assert trainer.saved == []
    _validate(cb, trainer, val_loss=3.0)
    assert [name for name, _, _ in trainer.saved] == ["c/epoch=0-step=4.ckpt"]


def test_stale_metric_on_the_last_batch_waits_for_the_validation_after_it(tmp_path: Path) -> None:
    trainer = _fake(tmp_path)
    cb = ModelCheckpoint(
        dirpath=tmp_path / "c", monitor="val_loss", every_n_train_steps=1, save_on_train_epoch_end=False
    )
    _start(cb, trainer)
    _metrics(trainer, val_loss=2.0)
    _step(cb, trainer, last=True)
    assert trainer.saved == []
    _validate(cb, trainer, val_loss=1.0)
    assert cb.best_model_score == torch.tensor(1.0) and len(trainer.saved) == 1


def test_missing_monitor_warns_before_validation_and_raises_after(tmp_path: Path) -> None:
    trainer = _fake(tmp_path)
    _metrics(trainer, train_loss=1.0)
    cb = ModelCheckpoint(dirpath=tmp_path / "c", monitor="val_acc")
    _start(cb, trainer)
    _step(cb, trainer)
    with pytest.warns(
        UserWarning, match=r"ModelCheckpoint\(monitor='val_acc'\) cannot find 'val_acc'.*'train_loss'"
    ):
        _end_epoch(cb, trainer)
    assert trainer.saved == []
    _step(cb, trainer)
    _validate(cb, trainer, val_loss=1.0)
    with pytest.raises(
        MisconfigurationError,
        match=r"cannot find 'val_acc' among the logged metrics \('train_loss', 'val_loss', 'epoch', 'step'\)",
    ):
        _end_epoch(cb, trainer)


def test_nothing_is_saved_in_sanity_check_fast_dev_run_or_outside_fit(tmp_path: Path) -> None:
    trainer = _fake(tmp_path, sanity_checking=True, val_check_interval=0.5)
    cb = ModelCheckpoint(dirpath=tmp_path / "c", monitor="val_loss", save_last=True)
    _start(cb, trainer)
    trainer.global_step = 3
    _validate(cb, trainer, val_loss=1.0)
    assert trainer.saved == [] and not cb._validation_has_run  # the sanity run does not count

    trainer = _fake(tmp_path, fast_dev_run=2)
    cb = ModelCheckpoint(dirpath=tmp_path / "c", every_n_train_steps=1, save_last=True)
    _start(cb, trainer)
    _step(cb, trainer, last=True)
    _end_epoch(cb, trainer)
    cb.on_train_end(trainer, None)
    assert trainer.saved == []

    trainer = _fake(tmp_path, val_check_interval=0.5, global_step=5)
    cb = ModelCheckpoint(dirpath=tmp_path / "c")
    _start(cb, trainer, stage="validate")
    _validate(cb, trainer, val_loss=1.0)
    assert trainer.saved == []


@pytest.mark.parametrize(
    ("attributes", "explicit", "expected"),
    [
        ({}, None, True),
        ({}, False, False),
        ({"num_val_batches": [], "val_check_interval": 0.5}, True, True),
        ({"check_val_every_n_epoch": 2}, None, False),
        ({"check_val_every_n_epoch": None, "val_check_interval": 100}, None, False),
        ({"num_val_batches": []}, None, True),
        ({"val_check_interval": 0.5}, None, False),
        ({"val_check_interval": 4}, None, False),
    ],
)
def test_where_epoch_checkpoints_are_taken(
    tmp_path: Path, attributes: dict[str, Any], explicit: bool | None, expected: bool
) -> None:
    cb = ModelCheckpoint(save_on_train_epoch_end=explicit)
    assert cb._should_save_on_train_epoch_end(_fake(tmp_path, **attributes)) is expected


def test_every_n_epochs_counts_epochs(tmp_path: Path) -> None:
    trainer = _fake(tmp_path, num_val_batches=[])
    cb = ModelCheckpoint(dirpath=tmp_path / "c", every_n_epochs=2, save_top_k=-1)
    _start(cb, trainer)
    for _ in range(4):
        for _ in range(3):
            _step(cb, trainer)
        _end_epoch(cb, trainer)
    assert _files(tmp_path / "c") == ["epoch=1-step=6.ckpt", "epoch=3-step=12.ckpt"]


def test_train_time_interval(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([0.0, 1.0, 2.5, 3.0, 6.0])
    monkeypatch.setattr(mc_module.time, "monotonic", lambda: next(clock))
    trainer = _fake(tmp_path)
    cb = ModelCheckpoint(dirpath=tmp_path / "c", train_time_interval=timedelta(seconds=2), save_top_k=-1)
    _start(cb, trainer)  # t=0
    for _ in range(4):  # t=1, 2.5 (save), 3, 6 (save)
        _step(cb, trainer)
    assert _files(tmp_path / "c") == ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt"]


def test_resumed_run_does_not_save_its_start_step_again(tmp_path: Path) -> None:
    trainer = _fake(tmp_path, global_step=10)
    cb = ModelCheckpoint(dirpath=tmp_path / "c", every_n_train_steps=5)
    _start(cb, trainer)
    cb.on_train_batch_end(trainer, None, {}, None, 0)  # a micro-batch before the first step of this run
    assert trainer.saved == []


# =================================================================== ModelCheckpoint: retention
def test_top_k_keeps_the_best_and_deletes_only_after_last_is_written(tmp_path: Path) -> None:
    trainer = _fake(tmp_path, num_val_batches=[])
    cb = ModelCheckpoint(dirpath=tmp_path / "c", monitor="loss", save_top_k=2, save_last=True)
    _start(cb, trainer)
    for loss in (3.0, 1.0, 2.0, 0.5):
        _step(cb, trainer)
        _metrics(trainer, loss=loss)
        _end_epoch(cb, trainer)
    assert _files(tmp_path / "c") == ["epoch=1-step=2.ckpt", "epoch=3-step=4.ckpt", "last.ckpt"]
    # when last.ckpt of epoch 3 was written, the evicted epoch=2 checkpoint still existed
    assert trainer.saved[-1] == (
        "c/last.ckpt",
        False,
        ["epoch=1-step=2.ckpt", "epoch=2-step=3.ckpt", "epoch=3-step=4.ckpt", "last.ckpt"],
    )
    c = os.path.realpath(tmp_path / "c")
    assert cb.best_model_path == os.path.join(c, "epoch=3-step=4.ckpt")
    assert cb.best_model_score == torch.tensor(0.5)
    assert cb.kth_best_model_path == os.path.join(c, "epoch=1-step=2.ckpt")
    assert cb.kth_value == torch.tensor(1.0)
    assert {os.path.basename(k): float(v) for k, v in cb.best_k_models.items()} == {
        "epoch=1-step=2.ckpt": 1.0,
        "epoch=3-step=4.ckpt": 0.5,
    }
    assert cb.last_model_path == os.path.join(c, "last.ckpt")


def test_nan_scores_rank_last(tmp_path: Path) -> None:
    trainer = _fake(tmp_path, num_val_batches=[])
    cb = ModelCheckpoint(dirpath=tmp_path / "c", monitor="loss", mode="max", save_top_k=2)
    _start(cb, trainer)
    for loss in (1.0, math.nan, 2.0):
        _step(cb, trainer)
        _metrics(trainer, loss=loss)
        _end_epoch(cb, trainer)
    assert sorted(float(v) for v in cb.best_k_models.values()) == [1.0, 2.0]


def test_monitor_none_keeps_the_newest(tmp_path: Path) -> None:
    trainer = _fake(tmp_path)
    cb = ModelCheckpoint(dirpath=tmp_path / "c", every_n_train_steps=1)  # save_top_k=1: the newest only
    _start(cb, trainer)
    for _ in range(3):
        _step(cb, trainer)
    assert _files(tmp_path / "c") == ["epoch=0-step=3.ckpt"]
    # save_top_k > 1 without a monitor is refused, as in Lightning; monitor="step" keeps the k newest
    with pytest.raises(
        MisconfigurationError,
        match=r"ModelCheckpoint\(save_top_k=2, monitor=None\) is invalid, as in Lightning: without a monitored "
        r"metric there is nothing to rank the checkpoints by, so only -1 \(keep all\), 0 and 1 \(keep the newest\) "
        r"are accepted. Pass monitor='<logged metric>' to keep the best 2, or monitor='step', mode='max' to keep "
        r"the 2 newest.",
    ):
        ModelCheckpoint(dirpath=tmp_path / "d", every_n_train_steps=1, save_top_k=2)
    cb = ModelCheckpoint(
        dirpath=tmp_path / "d", every_n_train_steps=1, save_top_k=2, monitor="step", mode="max"
    )
    _start(cb, trainer)
    for _ in range(3):
        _step(cb, trainer)
    assert _files(tmp_path / "d") == ["epoch=0-step=5.ckpt", "epoch=0-step=6.ckpt"]


def test_save_last_link_points_at_the_newest_checkpoint(tmp_path: Path) -> None:
    trainer = _fake(tmp_path)
    cb = ModelCheckpoint(dirpath=tmp_path / "c", every_n_train_steps=1, save_last="link")
    _start(cb, trainer)
    for _ in range(3):
        _step(cb, trainer)
    assert _files(tmp_path / "c") == ["epoch=0-step=3.ckpt", "last.ckpt->epoch=0-step=3.ckpt"]
    assert (tmp_path / "c" / "last.ckpt").read_text() == "step 3"
    # last.ckpt was never written: it is a link
    assert [name for name, _, _ in trainer.saved] == [f"c/epoch=0-step={i}.ckpt" for i in (1, 2, 3)]


def test_a_real_save_replaces_a_link_without_touching_its_target(tmp_path: Path) -> None:
    folder = tmp_path / "c"
    folder.mkdir()
    (folder / "keep.ckpt").write_text("old run")
    (folder / "last.ckpt").symlink_to("keep.ckpt")
    trainer = _fake(tmp_path)
    cb = ModelCheckpoint(dirpath=folder, every_n_train_steps=1, save_top_k=0, save_last=True)
    cb.load_state_dict(
        {**cb.state_dict(), "dirpath": cb.dirpath, "last_model_path": str(folder / "last.ckpt")}
    )
    _start(cb, trainer)
    _step(cb, trainer)
    assert not (folder / "last.ckpt").is_symlink() and (folder / "last.ckpt").read_text() == "step 1"
    assert (folder / "keep.ckpt").read_text() == "old run"


def test_version_counter(tmp_path: Path) -> None:
    folder = tmp_path / "c"
    folder.mkdir()
    for name in ("epoch=0-step=1.ckpt", "last.ckpt"):
        (folder / name).write_text("earlier run")
    trainer = _fake(tmp_path)
    cb = ModelCheckpoint(dirpath=folder, every_n_train_steps=1, save_last=True)
    with pytest.warns(UserWarning, match=r"Checkpoint directory .* exists and is not empty"):
        _start(cb, trainer)
    _step(cb, trainer)
    assert _files(folder) == ["epoch=0-step=1-v1.ckpt", "epoch=0-step=1.ckpt", "last-v1.ckpt", "last.ckpt"]
    assert cb.last_model_path.endswith("last-v1.ckpt") and cb.best_model_path.endswith("step=1-v1.ckpt")

    cb = ModelCheckpoint(dirpath=folder, every_n_train_steps=1, save_last=True, enable_version_counter=False)
    trainer = _fake(tmp_path)
    _start(cb, trainer)
    _step(cb, trainer)
    assert [(folder / n).read_text() for n in ("epoch=0-step=1.ckpt", "last.ckpt")] == ["step 1", "step 1"]


def test_a_checkpoint_resumed_from_is_not_deleted(tmp_path: Path) -> None:
    trainer = _fake(tmp_path)
    cb = ModelCheckpoint(dirpath=tmp_path / "c", every_n_train_steps=1)
    _start(cb, trainer)
    _step(cb, trainer)
    trainer.ckpt_path = cb.best_model_path
    _step(cb, trainer)
    assert _files(tmp_path / "c") == ["epoch=0-step=1.ckpt", "epoch=0-step=2.ckpt"]


def test_save_weights_only_reaches_save_checkpoint(tmp_path: Path) -> None:
    trainer = _fake(tmp_path)
    cb = ModelCheckpoint(
        dirpath=tmp_path / "c", every_n_train_steps=1, save_weights_only=True, save_last=True
    )
    _start(cb, trainer)
    _step(cb, trainer)
    assert [weights_only for _, weights_only, _ in trainer.saved] == [True, True]


def test_save_on_exception(tmp_path: Path) -> None:
    trainer = _fake(tmp_path)
    cb = ModelCheckpoint(dirpath=tmp_path / "c", save_on_exception=True)
    _start(cb, trainer)
    trainer.global_step = 3
    cb.on_exception(trainer, None, ValueError("boom"))
    assert _files(tmp_path / "c") == ["epoch=0-step=3.ckpt"]
    trainer = _fake(tmp_path, world_size=2, global_step=4)
    _start(cb, trainer)
    trainer.global_step = 5
    with pytest.warns(UserWarning, match=r"save_on_exception=True\) saves only in single-process runs"):
        cb.on_exception(trainer, None, ValueError("boom"))


def test_state_dict_round_trip_and_a_moved_directory(tmp_path: Path) -> None:
    trainer = _fake(tmp_path, num_val_batches=[])
    cb = ModelCheckpoint(dirpath=tmp_path / "c", monitor="loss", save_last=True)
    _start(cb, trainer)
    _step(cb, trainer)
    _metrics(trainer, loss=0.25)
    _end_epoch(cb, trainer)
    state = cb.state_dict()
    assert set(state) == {
        "monitor", "best_model_score", "best_model_path", "current_score", "dirpath", "best_k_models",
        "kth_best_model_path", "kth_value", "last_model_path",
    }  # fmt: skip
    same = ModelCheckpoint(dirpath=tmp_path / "c", monitor="loss")
    same.load_state_dict(state)
    assert (same.best_model_path, same.last_model_path) == (cb.best_model_path, cb.last_model_path)
    assert same.best_model_score == torch.tensor(0.25) and same.best_k_models == cb.best_k_models
    moved = ModelCheckpoint(dirpath=tmp_path / "elsewhere", monitor="loss")
    with pytest.warns(UserWarning, match=r"dirpath changed from .* only best_model_path is restored"):
        moved.load_state_dict(state)
    assert moved.best_model_path == cb.best_model_path and moved.best_k_models == {}


def test_default_directory(tmp_path: Path) -> None:
    trainer = _fake(tmp_path)
    cb = ModelCheckpoint()
    _start(cb, trainer)
    assert cb.dirpath == os.path.join(str(tmp_path), "checkpoints")
    trainer = _fake(tmp_path, loggers=[CSVLogger(tmp_path / "logs", name="exp", version=3)])
    cb = ModelCheckpoint()
    _start(cb, trainer)
    assert cb.dirpath == str(tmp_path / "logs" / "exp" / "version_3" / "checkpoints")


def test_to_yaml_and_newest_checkpoint(tmp_path: Path) -> None:
    trainer = _fake(tmp_path, num_val_batches=[])
    cb = ModelCheckpoint(dirpath=tmp_path / "c", monitor="loss", save_top_k=-1, save_last=True)
    _start(cb, trainer)
    for loss in (2.0, math.inf):
        _step(cb, trainer)
        _metrics(trainer, loss=loss)
        _end_epoch(cb, trainer)
    cb.to_yaml()
    c = cb.dirpath
    assert (tmp_path / "c" / "best_k_models.yaml").read_text() == (
        f'"{c}/epoch=0-step=1.ckpt": 2.0\n"{c}/epoch=1-step=2.ckpt": .inf\n'
    )
    assert cb.newest_checkpoint() == os.path.join(c or "", "last.ckpt")
    (tmp_path / "c" / "epoch=9-step=99.ckpt").mkdir()  # a sharded save that never committed
    assert cb.newest_checkpoint() == os.path.join(c or "", "last.ckpt")


# ============================================================================== EarlyStopping
def _es_run(es: EarlyStopping, tmp_path: Path, values: list[float], **attributes: Any) -> Any:
    """Check after each value (at train epoch end, the default) until the trainer is told to stop."""
    trainer = _fake(tmp_path, **attributes)
    es.setup(trainer, None, "fit")
    for value in values:
        _metrics(trainer, val_loss=value)
        _end_epoch(es, trainer)
        if trainer.should_stop:
            break
    return trainer


@pytest.mark.parametrize(
    ("kwargs", "values", "stopped_after", "reason", "wait", "best"),
    [
        ({"patience": 2}, [5, 4, 4.5, 4.2, 3], 4, EarlyStoppingReason.PATIENCE_EXHAUSTED, 2, 4.0),
        ({"patience": 0}, [5, 5], 2, EarlyStoppingReason.PATIENCE_EXHAUSTED, 1, 5.0),
        ({"patience": 1, "min_delta": 0.5}, [5, 4.5, 4.4], 2, EarlyStoppingReason.PATIENCE_EXHAUSTED, 1, 5.0),
        ({"patience": 1, "mode": "max"}, [1, 2, 1], 3, EarlyStoppingReason.PATIENCE_EXHAUSTED, 1, 2.0),
        ({"stopping_threshold": 4.0}, [5, 4.0, 3.9], 3, EarlyStoppingReason.STOPPING_THRESHOLD, 0, 4.0),
        ({"divergence_threshold": 6}, [5, 6, 6.1], 3, EarlyStoppingReason.DIVERGENCE_THRESHOLD, 1, 5.0),
        ({}, [5, math.inf], 2, EarlyStoppingReason.NON_FINITE_METRIC, 0, 5.0),
        (
            {"patience": 2, "check_finite": False},
            [5, math.nan, math.nan],
            3,
            EarlyStoppingReason.PATIENCE_EXHAUSTED,
            2,
            5.0,
        ),
        ({"patience": 5}, [5, 4, 3], None, EarlyStoppingReason.NOT_STOPPED, 0, 3.0),
    ],
)
def test_early_stopping_rules(
    tmp_path: Path,
    kwargs: dict[str, Any],
    values: list[float],
    stopped_after: int | None,
    reason: EarlyStoppingReason,
    wait: int,
    best: float,
) -> None:
    es = EarlyStopping(monitor="val_loss", **kwargs)
    trainer = _es_run(es, tmp_path, values)
    assert trainer.should_stop is (stopped_after is not None)
    assert es.stopped_epoch == (stopped_after - 1 if stopped_after else 0)
    assert (es.stopping_reason, es.wait_count, float(es.best_score)) == (reason, wait, best)
    assert (es.stopping_reason_message is None) is (stopped_after is None)


def test_early_stopping_missing_metric(tmp_path: Path) -> None:
    trainer = _fake(tmp_path)
    _metrics(trainer, train_loss=1.0, val_loss=2.0)
    es = EarlyStopping(monitor="val_acc")
    es.setup(trainer, None, "fit")
    with pytest.raises(
        RuntimeError,
        match=r"EarlyStopping\(monitor='val_acc'\) cannot find 'val_acc' among the logged metrics \('train_loss', "
        r"'val_loss'\).*strict=False",
    ):
        es.on_train_epoch_end(trainer, None)
    es = EarlyStopping(monitor="val_acc", strict=False)
    es.setup(trainer, None, "fit")
    with warnings_recorded() as caught:
        es.on_train_epoch_end(trainer, None)
    assert caught == [] and not trainer.should_stop
    es = EarlyStopping(monitor="val_acc", strict=False, verbose=True)
    es.setup(trainer, None, "fit")
    with pytest.warns(RuntimeWarning, match=r"cannot find 'val_acc'"):
        es.on_train_epoch_end(trainer, None)


@pytest.mark.parametrize(
    ("attributes", "explicit", "on_train_epoch_end"),
    [
        ({}, None, True),
        ({"val_check_interval": 0.25}, None, False),
        ({"val_check_interval": 100}, None, False),
        ({"check_val_every_n_epoch": 3}, None, False),
        ({}, False, False),
        ({"val_check_interval": 0.25}, True, True),
    ],
)
def test_early_stopping_checks_where_lightning_does(
    tmp_path: Path, attributes: dict[str, Any], explicit: bool | None, on_train_epoch_end: bool
) -> None:
    trainer = _fake(tmp_path, **attributes)
    _metrics(trainer, val_loss=1.0)
    es = EarlyStopping(monitor="val_loss", patience=0, check_on_train_epoch_end=explicit)
    es.setup(trainer, None, "fit")
    for _ in range(2):
        es.on_validation_end(trainer, None)
        es.on_train_epoch_end(trainer, None)
    assert es.wait_count == 1 and trainer.should_stop  # two checks (best, then no improvement), not four
    checked_in_epoch_end = EarlyStopping(monitor="val_loss", check_on_train_epoch_end=explicit)
    checked_in_epoch_end.setup(trainer, None, "fit")
    checked_in_epoch_end.on_train_epoch_end(trainer, None)
    assert (float(checked_in_epoch_end.best_score) == 1.0) is on_train_epoch_end


def test_early_stopping_skips_sanity_check_fast_dev_run_and_other_stages(tmp_path: Path) -> None:
    for attributes, stage in (
        ({"sanity_checking": True}, "fit"),
        ({"fast_dev_run": 1}, "fit"),
        ({}, "validate"),
    ):
        trainer = _fake(tmp_path, check_val_every_n_epoch=2, **attributes)
        _metrics(trainer, val_loss=1.0)
        es = EarlyStopping(monitor="val_loss", patience=0)
        es.setup(trainer, None, stage)
        for _ in range(3):
            es.on_validation_end(trainer, None)
        assert not trainer.should_stop and es.wait_count == 0, (attributes, stage)


def test_one_rank_asking_to_stop_stops_all(tmp_path: Path) -> None:
    es = EarlyStopping(monitor="val_loss")
    trainer = _es_run(es, tmp_path, [5, 4], strategy=_Strategy(other_votes=(True,)))
    # this rank saw an improvement, the other one asked to stop
    assert trainer.should_stop and es.stopped_epoch == 0 and es.wait_count == 0
    assert trainer.strategy.reductions == [(False, False)]  # reduced with all=False: any rank is enough
    es = EarlyStopping(monitor="val_loss", patience=1)
    trainer = _es_run(es, tmp_path, [5, 6, 7], strategy=_Strategy(other_votes=(False,)))
    assert trainer.should_stop and es.stopped_epoch == 1


def test_early_stopping_state(tmp_path: Path) -> None:
    es = EarlyStopping(monitor="val_loss", patience=1)
    _es_run(es, tmp_path, [5, 6])
    state = es.state_dict()
    assert state == {
        "wait_count": 1,
        "stopped_epoch": 1,
        "best_score": torch.tensor(5.0),
        "patience": 1,
        "stopping_reason": EarlyStoppingReason.PATIENCE_EXHAUSTED.value,
        "stopping_reason_message": es.stopping_reason_message,
    }
    restored = EarlyStopping(monitor="val_loss")
    restored.load_state_dict(state)
    assert (restored.wait_count, restored.patience, float(restored.best_score)) == (1, 1, 5.0)
    assert restored.stopping_reason is EarlyStoppingReason.PATIENCE_EXHAUSTED
    assert es.state_key == "EarlyStopping{'monitor': 'val_loss', 'mode': 'min'}"


def test_early_stopping_verbose_messages(tmp_path: Path, captured: pytest.LogCaptureFixture) -> None:
    _es_run(EarlyStopping(monitor="val_loss", patience=1, verbose=True), tmp_path, [5, 4, 4.5])
    assert captured.messages == [
        "val_loss improved; new best 5.000.",
        "val_loss improved by 1.000 (min_delta=0.0); new best 4.000.",
        "Stopping: val_loss did not improve in the last 1 checks (patience=1); best 4.000.",
    ]
    captured.clear()
    _es_run(EarlyStopping(monitor="val_loss", verbose=True), tmp_path, [5], world_size=2, global_rank=1)
    assert captured.messages == ["[rank: 1] val_loss improved; new best 5.000."]
    captured.clear()
    es = EarlyStopping(monitor="val_loss", verbose=True, log_rank_zero_only=True)
    _es_run(es, tmp_path, [5], world_size=2, global_rank=1)
    assert captured.messages == []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"monitor": None}, r"EarlyStopping\(monitor=None\) is invalid: pass the name of a logged metric"),
        (
            {"mode": "auto"},
            r"EarlyStopping\(mode='auto'\) is invalid: use 'min' \(lower is better\) or 'max'",
        ),
        ({"patience": -1}, r"EarlyStopping\(patience=-1\) is invalid: use an int >= 0"),
        ({"min_delta": -0.1}, r"EarlyStopping\(min_delta=-0.1\) is invalid: use a number >= 0"),
        (
            {"stopping_threshold": "0.1"},
            r"EarlyStopping\(stopping_threshold='0.1'\) is invalid: use a number",
        ),
        ({"strict": "no"}, r"EarlyStopping\(strict='no'\) is invalid: use True or False"),
        ({"check_on_train_epoch_end": 1}, r"EarlyStopping\(check_on_train_epoch_end=1\) is invalid"),
    ],
)
def test_early_stopping_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(MisconfigurationError, match=match):
        EarlyStopping(**{"monitor": "val_loss", **kwargs})


# ========================================================================= LearningRateMonitor
class _Recorder(Logger):
    def __init__(self, log_dir: str = "never-written") -> None:
        self.rows: list[tuple[int, dict[str, float]]] = []
        self._log_dir = log_dir

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> int:
        return 0

    @property
    def log_dir(self) -> str:
        return self._log_dir

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        values = {k: round(float(v), 6) for k, v in metrics.items() if k.startswith(("lr", "my"))}
        if values:
            self.rows.append((step, values))

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        pass

    def save(self) -> None:
        pass


def _params(n: int = 1) -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.zeros(1)) for _ in range(n)]


def _sched(optimizer: Any, **kwargs: Any) -> LRSchedulerConfig:
    return LRSchedulerConfig(torch.optim.lr_scheduler.StepLR(optimizer, 1), **kwargs)


def _names_for(tmp_path: Path, optimizers: list[Any], schedulers: list[LRSchedulerConfig]) -> list[str]:
    trainer = _fake(tmp_path, optimizers=optimizers, lr_scheduler_configs=schedulers, loggers=[_Recorder()])
    monitor = LearningRateMonitor()
    monitor.on_train_start(trainer, None)
    return list(monitor.lrs)


def test_learning_rate_names(tmp_path: Path) -> None:
    sgd = torch.optim.SGD(_params(), lr=0.1)
    assert _names_for(tmp_path, [sgd], []) == ["lr-SGD"]
    two = torch.optim.Adam([{"params": _params()}, {"params": _params(), "lr": 0.5}], lr=0.1)
    assert _names_for(tmp_path, [two], []) == ["lr-Adam/pg1", "lr-Adam/pg2"]
    named = torch.optim.SGD(
        [{"params": _params(), "name": "enc"}, {"params": _params(), "name": "dec"}], lr=0.1
    )
    assert _names_for(tmp_path, [named], []) == ["lr-SGD/enc", "lr-SGD/dec"]
    one_named = torch.optim.SGD([{"params": _params(), "name": "enc"}], lr=0.1)
    assert _names_for(tmp_path, [one_named], []) == ["lr-SGD/enc"]
    assert _names_for(tmp_path, [sgd], [_sched(sgd, name="my_lr")]) == ["my_lr"]
    sgd2, adam = torch.optim.SGD(_params(), lr=0.2), torch.optim.Adam(_params())
    # schedulers' optimizers first; the second unnamed SGD gets "-1"
    assert _names_for(tmp_path, [sgd, sgd2, adam], [_sched(sgd2)]) == ["lr-SGD", "lr-SGD-1", "lr-Adam"]
    assert _names_for(tmp_path, [sgd, sgd2], [_sched(sgd2, name="warm")]) == ["warm", "lr-SGD"]
    duplicated = torch.optim.SGD(
        [{"params": _params(), "name": "a"}, {"params": _params(), "name": "a"}], lr=0.1
    )
    with pytest.raises(MisconfigurationError, match=r"param groups of lr-SGD have the same 'name' \['a'\]"):
        _names_for(tmp_path, [duplicated], [])


def test_learning_rate_intervals_rank_zero_and_callback_metrics(tmp_path: Path) -> None:
    stepped = torch.optim.SGD(_params(), lr=0.1, momentum=0.9, weight_decay=0.01)
    per_epoch = torch.optim.Adam(_params(), lr=0.01, betas=(0.8, 0.99))
    plain = torch.optim.SGD(_params(), lr=0.3)
    recorder = _Recorder()
    trainer = _fake(
        tmp_path,
        optimizers=[stepped, per_epoch, plain],
        lr_scheduler_configs=[_sched(stepped, interval="step"), _sched(per_epoch, name="my_lr")],
        loggers=[recorder],
        log_every_n_steps=2,
    )
    monitor = LearningRateMonitor(log_momentum=True, log_weight_decay=True)
    monitor.on_train_start(trainer, None)
    monitor.on_train_epoch_start(trainer, None)
    for step in range(4):
        trainer.logger_step = step
        monitor.on_train_batch_start(trainer, None, None, step)
    assert [(step, sorted(values)) for step, values in recorder.rows] == [
        (0, sorted(["my_lr", "my_lr-momentum", "my_lr-weight_decay", "lr-SGD-1", "lr-SGD-1-momentum", "lr-SGD-1-weight_decay"])),
        (1, sorted(["lr-SGD", "lr-SGD-momentum", "lr-SGD-weight_decay", "lr-SGD-1", "lr-SGD-1-momentum", "lr-SGD-1-weight_decay"])),
        (3, sorted(["lr-SGD", "lr-SGD-momentum", "lr-SGD-weight_decay", "lr-SGD-1", "lr-SGD-1-momentum", "lr-SGD-1-weight_decay"])),
    ]  # fmt: skip
    assert recorder.rows[0][1]["my_lr-momentum"] == 0.8 and recorder.rows[1][1]["lr-SGD-weight_decay"] == 0.01
    assert float(trainer.callback_metrics["lr-SGD"]) == pytest.approx(0.1)
    assert monitor.lrs == {"lr-SGD": [0.1, 0.1], "my_lr": [0.01], "lr-SGD-1": [0.3, 0.3, 0.3]}

    trainer.is_global_zero = False
    trainer.should_stop = True  # a stop request logs at once
    monitor.on_train_batch_start(trainer, None, None, 4)
    trainer.is_global_zero, trainer.fast_dev_run = True, 1
    monitor.on_train_batch_start(trainer, None, None, 5)
    assert len(recorder.rows) == 3 and monitor.lrs["lr-SGD"] == [0.1] * 4  # values kept, nothing logged


def test_learning_rate_monitor_interval_override_and_new_param_groups(tmp_path: Path) -> None:
    optimizer = torch.optim.SGD(_params(), lr=0.1)
    recorder = _Recorder()
    trainer = _fake(
        tmp_path, optimizers=[optimizer], lr_scheduler_configs=[_sched(optimizer)], loggers=[recorder]
    )
    monitor = LearningRateMonitor(logging_interval="step")
    monitor.on_train_start(trainer, None)
    monitor.on_train_epoch_start(trainer, None)
    monitor.on_train_batch_start(trainer, None, None, 0)
    assert recorder.rows == [(0, {"lr-SGD": 0.1})]  # the epoch scheduler logged per step only
    optimizer.add_param_group({"params": _params(), "lr": 0.5})
    monitor.on_train_batch_start(trainer, None, None, 1)
    assert monitor.lrs == {"lr-SGD/pg1": [0.1, 0.1], "lr-SGD/pg2": [0.5]}


def test_learning_rate_monitor_errors_and_warnings(tmp_path: Path) -> None:
    with pytest.raises(
        MisconfigurationError, match=r"logging_interval='batch'\) is invalid: use 'step', 'epoch'"
    ):
        LearningRateMonitor(logging_interval="batch")
    with pytest.raises(MisconfigurationError, match=r"LearningRateMonitor\(log_momentum=1\) is invalid"):
        LearningRateMonitor(log_momentum=1)  # type: ignore[arg-type]
    optimizer = torch.optim.Adagrad(_params())
    with pytest.raises(
        MisconfigurationError, match=r"LearningRateMonitor needs a logger, but the Trainer has none"
    ):
        LearningRateMonitor().on_train_start(_fake(tmp_path, optimizers=[optimizer]), None)
    trainer = _fake(tmp_path, optimizers=[optimizer], loggers=[_Recorder()])
    monitor = LearningRateMonitor(log_momentum=True)
    with pytest.warns(RuntimeWarning, match=r"Adagrad has no momentum \(nor betas\); 0 is logged"):
        monitor.on_train_start(trainer, None)
    monitor.on_train_batch_start(trainer, None, None, 0)
    assert trainer.loggers[0].rows == [(0, {"lr-Adagrad": 0.01, "lr-Adagrad-momentum": 0.0})]
    assert monitor.last_momentum_values == {"lr-Adagrad-momentum": 0.0}


# ======================================================= end to end, expectations from Lightning
class _Scripted(fullshard.Module):
    """The module the Lightning runs used: 48 training samples (6 batches of 8), 16 validation
    samples (2 batches); ``val_loss`` is ``vals[k]`` at the k-th validation (after the sanity run),
    the real loss when ``vals`` is None."""

    def __init__(self, vals: list[float] | None = None, opt: Any = None) -> None:
        super().__init__()
        self.l = torch.nn.Linear(4, 1)
        self.l2 = torch.nn.Linear(4, 1)
        self.vals, self.opt, self.validations = vals, opt, 0

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = F.mse_loss(self.l(batch[0]) + 0 * self.l2(batch[0]), batch[1])
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if self.vals is None:
            self.log("val_loss", F.mse_loss(self.l(batch[0]), batch[1]))
        else:
            k = 0 if self.trainer.sanity_checking else self.validations
            self.log("val_loss", float(self.vals[min(k, len(self.vals) - 1)]))

    def on_validation_epoch_end(self) -> None:
        if not self.trainer.sanity_checking:
            self.validations += 1

    def configure_optimizers(self) -> Any:
        return self.opt(self) if self.opt else torch.optim.SGD(self.parameters(), lr=0.01)


def _data(n: int, seed: int = 0) -> DataLoader[Any]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


def _fit(root: Path, model: fullshard.Module, callbacks: list[Any], val: bool = True, **kwargs: Any) -> Any:
    kwargs.setdefault("enable_checkpointing", True)
    kwargs.setdefault("enable_model_summary", False)
    trainer = quiet_trainer(root, callbacks=callbacks, **kwargs)
    trainer.fit(model, _data(48), _data(16, 1) if val else None)
    return trainer


def _tree(folder: Path) -> list[str]:
    found = []
    for path in sorted(folder.rglob("*")) if folder.is_dir() else []:
        if path.is_symlink():
            found.append(f"{path.relative_to(folder)}->{os.readlink(path)}")
        elif path.is_file():
            found.append(str(path.relative_to(folder)))
    return found


_V = [3.0, 2.0, 2.5, 1.0, 1.5, 0.5]
# (name, ModelCheckpoint kwargs, Trainer kwargs, scripted val_loss or None, with validation data,
#  files Lightning 2.6.6 left, its best_model_path's name, its best_model_score)
_CHECKPOINT_CASES = [
    ("default", {}, {"max_epochs": 2}, None, True, ["epoch=1-step=12.ckpt"], "epoch=1-step=12.ckpt", None),
    ("max_steps_mid_epoch", {}, {"max_steps": 4}, None, True, ["epoch=0-step=4.ckpt"], "epoch=0-step=4.ckpt", None),
    ("max_steps_last_every_2_epochs", {"save_last": True, "every_n_epochs": 2}, {"max_steps": 4}, None, True,
     ["last.ckpt"], "", None),
    ("steps_3_last", {"every_n_train_steps": 3, "save_last": True}, {"max_steps": 4}, None, True,
     ["epoch=0-step=3.ckpt", "last.ckpt"], "epoch=0-step=3.ckpt", None),
    ("steps_monitor_val", {"every_n_train_steps": 2, "monitor": "val_loss", "save_top_k": 2}, {"max_epochs": 2}, _V,
     True, ["epoch=1-step=10.ckpt", "epoch=1-step=8.ckpt"], "epoch=1-step=8.ckpt", 3.0),
    ("steps_monitor_val_interval_4", {"every_n_train_steps": 2, "monitor": "val_loss", "save_top_k": -1},
     {"max_epochs": 2, "val_check_interval": 4}, _V, True,
     ["epoch=0-step=4.ckpt", "epoch=1-step=10.ckpt", "epoch=1-step=8.ckpt"], "epoch=0-step=4.ckpt", 3.0),
    ("steps_monitor_val_after_validation",
     {"every_n_train_steps": 2, "monitor": "val_loss", "save_top_k": 2, "save_on_train_epoch_end": False},
     {"max_epochs": 2}, _V, True, ["epoch=1-step=12.ckpt", "epoch=1-step=8.ckpt"], "epoch=1-step=12.ckpt", 2.0),
    ("steps_monitor_never_logged_last",
     {"every_n_train_steps": 2, "monitor": "val_loss", "save_top_k": 2, "save_last": True}, {"max_epochs": 2}, _V,
     False, ["last.ckpt"], "", None),
    ("filename_metric", {"filename": "{epoch}-{val_loss:.2f}", "monitor": "val_loss"}, {"max_epochs": 1}, [0.123],
     True, ["epoch=0-val_loss=0.12.ckpt"], "epoch=0-val_loss=0.12.ckpt", 0.123),
    ("filename_slash", {"filename": "{epoch}-{val/loss:.2f}"}, {"max_epochs": 1}, None, True,
     ["epoch=0-val/loss=0.00.ckpt"], "loss=0.00.ckpt", None),
    ("filename_no_insert", {"filename": "e{epoch:02d}-s{step}", "auto_insert_metric_name": False},
     {"max_epochs": 1}, None, True, ["e00-s6.ckpt"], "e00-s6.ckpt", None),
    ("fast_dev_run", {}, {"fast_dev_run": 2}, None, True, [], "", None),
    ("link", {"save_last": "link", "every_n_train_steps": 2, "save_top_k": -1}, {"max_steps": 5}, None, True,
     ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt", "last.ckpt->epoch=0-step=4.ckpt"], "epoch=0-step=4.ckpt", None),
    ("link_monitor", {"save_last": "link", "save_top_k": 2, "monitor": "val_loss"}, {"max_epochs": 4}, _V, True,
     ["epoch=1-step=12.ckpt", "epoch=3-step=24.ckpt", "last.ckpt->epoch=3-step=24.ckpt"], "epoch=3-step=24.ckpt", 1.0),
    ("link_top_0", {"save_last": "link", "save_top_k": 0}, {"max_epochs": 2}, None, True, ["last.ckpt"], "", None),
    ("every_2_epochs_last", {"every_n_epochs": 2, "save_top_k": -1, "save_last": True}, {"max_epochs": 3}, None,
     True, ["epoch=1-step=12.ckpt", "last.ckpt"], "epoch=1-step=12.ckpt", None),
    ("validate_every_2_epochs", {"save_top_k": -1}, {"max_epochs": 3, "check_val_every_n_epoch": 2}, None, True,
     ["epoch=1-step=12.ckpt"], "epoch=1-step=12.ckpt", None),
    ("validate_every_2_epochs_no_data", {"save_top_k": -1}, {"max_epochs": 3, "check_val_every_n_epoch": 2}, None,
     False, [], "", None),
    ("fixed_name", {"filename": "fixed", "save_top_k": -1, "every_n_train_steps": 2}, {"max_steps": 6}, None, True,
     ["fixed.ckpt"], "fixed.ckpt", None),
    ("top_2_epochs", {"monitor": "val_loss", "save_top_k": 2}, {"max_epochs": 6}, _V, True,
     ["epoch=3-step=24.ckpt", "epoch=5-step=36.ckpt"], "epoch=5-step=36.ckpt", 0.5),
    ("top_2_max_same_name", {"monitor": "val_loss", "save_top_k": 2, "mode": "max", "filename": "{epoch}"},
     {"max_epochs": 6}, _V, True, ["epoch=0.ckpt", "epoch=2.ckpt"], "epoch=0.ckpt", 3.0),
    ("steps_same_name_versions", {"filename": "{epoch}", "every_n_train_steps": 2, "save_top_k": 2,
     "monitor": "val_loss"}, {"max_epochs": 3, "val_check_interval": 2}, _V, True,
     ["epoch=1.ckpt", "epoch=2.ckpt"], "epoch=1.ckpt", 0.5),
    ("nan", {"monitor": "val_loss", "save_top_k": 2}, {"max_epochs": 4}, [2.0, math.nan, 1.0, 3.0], True,
     ["epoch=0-step=6.ckpt", "epoch=2-step=18.ckpt"], "epoch=2-step=18.ckpt", 1.0),
    ("top_0", {"save_top_k": 0}, {"max_epochs": 2}, None, True, [], "", None),
    ("steps_0", {"every_n_train_steps": 0}, {"max_epochs": 2}, None, True, [], "", None),
    ("accumulation", {"every_n_train_steps": 1, "save_top_k": -1}, {"max_epochs": 1, "accumulate_grad_batches": 2},
     None, True, ["epoch=0-step=1.ckpt", "epoch=0-step=2.ckpt", "epoch=0-step=3.ckpt"], "epoch=0-step=3.ckpt", None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("ckpt_kwargs", "trainer_kwargs", "vals", "val", "files", "best", "score"),
    [case[1:] for case in _CHECKPOINT_CASES],
    ids=[case[0] for case in _CHECKPOINT_CASES],
)
def test_checkpoints_match_lightning(
    tmp_path: Path,
    ckpt_kwargs: dict[str, Any],
    trainer_kwargs: dict[str, Any],
    vals: list[float] | None,
    val: bool,
    files: list[str],
    best: str,
    score: float | None,
) -> None:
    cb = ModelCheckpoint(dirpath=tmp_path / "c", **ckpt_kwargs)
    _fit(tmp_path, _Scripted(vals), [cb], val=val, **trainer_kwargs)
    assert _tree(tmp_path / "c") == sorted(files)
    assert os.path.basename(cb.best_model_path) == best
    assert (None if cb.best_model_score is None else round(float(cb.best_model_score), 4)) == score


def test_rerun_in_the_same_directory_adds_versions_as_lightning(tmp_path: Path) -> None:
    for _ in range(2):
        cb = ModelCheckpoint(dirpath=tmp_path / "c", save_last=True)
        _fit(tmp_path, _Scripted(), [cb], max_epochs=1)
    assert _tree(tmp_path / "c") == [
        "epoch=0-step=6-v1.ckpt",
        "epoch=0-step=6.ckpt",
        "last-v1.ckpt",
        "last.ckpt",
    ]
    assert cb.last_model_path.endswith("last-v1.ckpt")


def test_default_directory_is_under_the_logger(tmp_path: Path) -> None:
    _fit(tmp_path, _Scripted(), [ModelCheckpoint()], max_epochs=1, logger=CSVLogger(tmp_path))
    assert _tree(tmp_path / "lightning_logs" / "version_0" / "checkpoints") == ["epoch=0-step=6.ckpt"]


def test_save_weights_only_leaves_optimizer_state_out(tmp_path: Path) -> None:
    cb = ModelCheckpoint(dirpath=tmp_path / "c", save_weights_only=True)
    _fit(tmp_path, _Scripted(), [cb], max_epochs=1)
    checkpoint = torch.load(cb.best_model_path, weights_only=False)
    assert checkpoint["state_dict"] and not checkpoint.get("optimizer_states")


# (name, EarlyStopping kwargs, Trainer kwargs, scripted val_loss, Lightning's: current_epoch,
#  global_step, stopped_epoch, wait_count, best_score, stopping_reason)
_STOPPING_CASES = [
    ("patience_2", {"patience": 2}, {"max_epochs": 10}, [5, 4, 4.5, 4.2, 3, 3], 4, 24, 3, 2, 4.0, "PATIENCE_EXHAUSTED"),
    ("min_delta", {"patience": 1, "min_delta": 0.5}, {"max_epochs": 10}, [5, 4.8, 4.2], 2, 12, 1, 1, 5.0, "PATIENCE_EXHAUSTED"),
    ("stopping_threshold", {"stopping_threshold": 4.1}, {"max_epochs": 10}, [5, 4.5, 4.0, 3], 3, 18, 2, 0, 4.5,
     "STOPPING_THRESHOLD"),
    ("divergence_threshold", {"divergence_threshold": 6}, {"max_epochs": 10}, [5, 7, 4, 3], 2, 12, 1, 0, 5.0,
     "DIVERGENCE_THRESHOLD"),
    ("nan", {}, {"max_epochs": 10}, [5, math.nan, 4, 3], 2, 12, 1, 0, 5.0, "NON_FINITE_METRIC"),
    ("val_every_3_batches", {"patience": 1}, {"max_epochs": 10, "val_check_interval": 3}, [5, 5, 5], 1, 6, 0, 1, 5.0,
     "PATIENCE_EXHAUSTED"),
    ("stop_mid_epoch", {"patience": 2}, {"max_epochs": 10, "val_check_interval": 2}, [5, 4, 4, 4, 4], 2, 8, 1, 2, 4.0,
     "PATIENCE_EXHAUSTED"),
    ("validate_every_2_epochs", {"patience": 1}, {"max_epochs": 10, "check_val_every_n_epoch": 2}, [5] * 6, 4, 24, 3,
     1, 5.0, "PATIENCE_EXHAUSTED"),
    ("fast_dev_run", {"patience": 1}, {"fast_dev_run": 3}, [5] * 6, 1, 3, 0, 0, math.inf, "NOT_STOPPED"),
    ("max", {"patience": 1, "mode": "max"}, {"max_epochs": 10}, [1, 2, 1], 3, 18, 2, 1, 2.0, "PATIENCE_EXHAUSTED"),
    ("after_validation", {"patience": 1, "check_on_train_epoch_end": False}, {"max_epochs": 10}, [5, 6, 6], 2, 12, 1,
     1, 5.0, "PATIENCE_EXHAUSTED"),
    ("min_epochs", {"patience": 1}, {"max_epochs": 10, "min_epochs": 4}, [5, 6, 6, 6, 6, 6], 4, 24, 3, 3, 5.0,
     "PATIENCE_EXHAUSTED"),
    ("min_epochs_mid_epoch_stop", {"patience": 1}, {"max_epochs": 10, "min_epochs": 1, "val_check_interval": 2},
     [5, 6, 7, 8], 1, 6, 0, 2, 5.0, "PATIENCE_EXHAUSTED"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("es_kwargs", "trainer_kwargs", "vals", "epoch", "step", "stopped", "wait", "best", "reason"),
    [case[1:] for case in _STOPPING_CASES],
    ids=[case[0] for case in _STOPPING_CASES],
)
def test_early_stopping_matches_lightning(
    tmp_path: Path,
    es_kwargs: dict[str, Any],
    trainer_kwargs: dict[str, Any],
    vals: list[float],
    epoch: int,
    step: int,
    stopped: int,
    wait: int,
    best: float,
    reason: str,
) -> None:
    es = EarlyStopping(monitor="val_loss", **es_kwargs)
    trainer = _fit(tmp_path, _Scripted(vals), [es], enable_checkpointing=False, **trainer_kwargs)
    assert (trainer.current_epoch, trainer.global_step) == (epoch, step)
    assert (es.stopped_epoch, es.wait_count, float(es.best_score), es.stopping_reason.name) == (
        stopped,
        wait,
        best,
        reason,
    )


def test_early_stopping_state_survives_a_resume(tmp_path: Path) -> None:
    vals = [5, 4, 4.5, 4.6, 4.7, 4.8]  # patience 3: stops after epoch 4

    def momentum(m: Any) -> Any:  # stateful: resuming plain SGD fails ("Expected device to be set")
        return torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)

    straight = _fit(
        tmp_path / "a", _Scripted(vals, momentum), [EarlyStopping("val_loss", patience=3)], max_epochs=10
    )
    ckpt = ModelCheckpoint(dirpath=tmp_path / "c", save_last=True)
    _fit(tmp_path, _Scripted(vals, momentum), [EarlyStopping("val_loss", patience=3), ckpt], max_epochs=3)
    es = EarlyStopping("val_loss", patience=3)
    resumed_model = _Scripted(vals, momentum)
    resumed_model.validations = 3  # the script's position, which is not part of the checkpoint
    trainer = quiet_trainer(tmp_path, callbacks=[es], max_epochs=10, enable_model_summary=False)
    trainer.fit(resumed_model, _data(48), _data(16, 1), ckpt_path=ckpt.last_model_path)
    assert (trainer.current_epoch, es.stopped_epoch, es.wait_count) == (straight.current_epoch, 4, 3)


# (name, LearningRateMonitor kwargs, Trainer kwargs, configure_optimizers, Lightning's (step, values) rows)
def _step_scheduler(m: Any) -> Any:
    optimizer = torch.optim.SGD(m.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.5)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def _epoch_scheduler(m: Any) -> Any:
    optimizer = torch.optim.SGD(m.parameters(), lr=0.1)
    return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.5)}


def _groups(m: Any) -> Any:
    groups = [{"params": m.l.parameters()}, {"params": m.l2.parameters(), "lr": 0.5}]
    return torch.optim.Adam(groups, lr=0.1, weight_decay=0.01)


_GROUP_VALUES = {
    "lr-Adam/pg1": 0.1, "lr-Adam/pg1-momentum": 0.9, "lr-Adam/pg1-weight_decay": 0.01,
    "lr-Adam/pg2": 0.5, "lr-Adam/pg2-momentum": 0.9, "lr-Adam/pg2-weight_decay": 0.01,
}  # fmt: skip
_LR_CASES = [
    ("no_scheduler", {}, {"max_epochs": 2, "log_every_n_steps": 2}, lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
     [(s, {"lr-SGD": 0.1}) for s in (0, 1, 3, 5, 6, 7, 9, 11)]),
    ("step_scheduler", {}, {"max_epochs": 2, "log_every_n_steps": 2}, _step_scheduler,
     [(1, {"lr-SGD": 0.05}), (3, {"lr-SGD": 0.0125}), (5, {"lr-SGD": 0.003125}), (7, {"lr-SGD": 0.000781}),
      (9, {"lr-SGD": 0.000195}), (11, {"lr-SGD": 4.9e-05})]),
    ("epoch_scheduler", {}, {"max_epochs": 2, "log_every_n_steps": 2}, _epoch_scheduler,
     [(0, {"lr-SGD": 0.1}), (6, {"lr-SGD": 0.05})]),
    ("epoch_scheduler_per_step", {"logging_interval": "step"}, {"max_epochs": 2, "log_every_n_steps": 2},
     _epoch_scheduler, [(s, {"lr-SGD": 0.1 if s < 6 else 0.05}) for s in (1, 3, 5, 7, 9, 11)]),
    ("step_scheduler_per_epoch", {"logging_interval": "epoch"}, {"max_epochs": 2, "log_every_n_steps": 2},
     _step_scheduler, [(0, {"lr-SGD": 0.1}), (6, {"lr-SGD": 0.001563})]),
    ("groups_momentum_weight_decay", {"log_momentum": True, "log_weight_decay": True},
     {"max_epochs": 1, "log_every_n_steps": 3}, _groups, [(s, _GROUP_VALUES) for s in (0, 2, 5)]),
    ("accumulation", {}, {"max_epochs": 1, "log_every_n_steps": 1, "accumulate_grad_batches": 2}, _step_scheduler,
     [(0, {"lr-SGD": 0.1}), (0, {"lr-SGD": 0.1}), (1, {"lr-SGD": 0.05}), (1, {"lr-SGD": 0.05}),
      (2, {"lr-SGD": 0.025}), (2, {"lr-SGD": 0.025})]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("lr_kwargs", "trainer_kwargs", "optimizers", "rows"),
    [case[1:] for case in _LR_CASES],
    ids=[case[0] for case in _LR_CASES],
)
def test_learning_rates_logged_as_lightning(
    tmp_path: Path,
    lr_kwargs: dict[str, Any],
    trainer_kwargs: dict[str, Any],
    optimizers: Any,
    rows: list[Any],
) -> None:
    recorder = _Recorder(str(tmp_path))
    callbacks = [LearningRateMonitor(**lr_kwargs)]
    _fit(
        tmp_path,
        _Scripted(None, optimizers),
        callbacks,
        logger=recorder,
        enable_checkpointing=False,
        **trainer_kwargs,
    )
    assert recorder.rows == rows


def test_learning_rate_monitor_without_logger_fails_at_train_start(tmp_path: Path) -> None:
    with pytest.raises(MisconfigurationError, match=r"LearningRateMonitor needs a logger"):
        _fit(tmp_path, _Scripted(), [LearningRateMonitor()], max_steps=1)


# ============================================================================ two processes
class _RankScripted(_Scripted):
    """Rank 0's val_loss keeps improving, rank 1's gets worse (not synced): rank 1 alone asks to stop."""

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        k = 0 if self.trainer.sanity_checking else self.validations
        self.log("val_loss", float(10 - k if self.global_rank == 0 else 5 + k))


@pytest.mark.multiprocess
def test_a_stop_asked_by_one_rank_stops_every_rank(tmp_path: Path) -> None:
    trainer = quiet_trainer(
        tmp_path,
        devices=2,
        strategy="ddp_spawn",
        max_epochs=10,
        callbacks=[EarlyStopping("val_loss", patience=1)],
        enable_model_summary=False,
    )
    trainer.fit(_RankScripted(), _data(48), _data(16, 1))
    # 3 batches per rank and epoch; rank 1's check after epoch 1 stops both ranks there
    assert (trainer.current_epoch, trainer.global_step) == (2, 6)
