"""Tests of the tqdm progress bar callback, driven by a fake trainer (its Lightning behaviours
through real runs: tests/test_bars_loggers.py)."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace
from typing import Any

import pytest

from fullshard.errors import MisconfigurationError
from fullshard.trainer.callbacks.progress_bar import ProgressBar, TQDMProgressBar

MODULE: Any = None  # the bar never looks at the module


def _trainer(**overrides: Any) -> Any:
    values: dict[str, Any] = {
        "is_global_zero": True,
        "current_epoch": 0,
        "global_step": 0,
        "num_training_batches": 5,
        "num_val_batches": [2],
        "num_sanity_val_batches": [2],
        "sanity_checking": False,
        "progress_bar_metrics": {"loss": 1.23456},
        "batch_idx_start": 0,
        "loggers": [],
    }
    values.update(overrides)
    return SimpleNamespace(**values)


def _run_epoch(bar: TQDMProgressBar, trainer: Any, batches: int) -> None:
    bar.on_train_epoch_start(trainer, MODULE)
    for batch_idx in range(batches):
        trainer.global_step += 1
        bar.on_train_batch_end(trainer, MODULE, None, None, batch_idx)
    bar.on_train_epoch_end(trainer, MODULE)


def _run_validation(bar: TQDMProgressBar, trainer: Any, batches: int | list[int]) -> None:
    """``batches``: per dataloader (an int: one dataloader)."""
    bar.on_validation_start(trainer, MODULE)
    for dataloader_idx, count in enumerate([batches] if isinstance(batches, int) else batches):
        for batch_idx in range(count):
            bar.on_validation_batch_start(trainer, MODULE, None, batch_idx, dataloader_idx)
            bar.on_validation_batch_end(trainer, MODULE, None, None, batch_idx, dataloader_idx)
    bar.on_validation_end(trainer, MODULE)


def _final_line(text: str) -> str:
    return re.split(r"[\r\n]", text.rstrip("\n"))[-1]


def test_training_bar_shows_epoch_count_step_and_metrics() -> None:
    out = io.StringIO()
    bar = TQDMProgressBar(mininterval=0, file=out)
    trainer = _trainer()
    _run_epoch(bar, trainer, batches=5)
    final = _final_line(out.getvalue())
    assert final.startswith("Epoch 0: 100%")
    assert "5/5" in final
    assert final.rstrip().endswith("loss=1.230]")

    trainer.current_epoch = 1
    _run_epoch(bar, trainer, batches=5)
    assert _final_line(out.getvalue()).startswith("Epoch 1: 100%")
    bar.on_train_end(trainer, MODULE)
    assert out.getvalue().endswith("\n")  # the finished bar is left on screen


def test_leave_keeps_each_epochs_bar() -> None:
    out = io.StringIO()
    bar = TQDMProgressBar(leave=True, mininterval=0, file=out)
    trainer = _trainer()
    _run_epoch(bar, trainer, batches=5)
    assert out.getvalue().endswith("\n")  # closed and kept at the epoch's end
    trainer.current_epoch = 1
    _run_epoch(bar, trainer, batches=5)
    kept = [line for line in out.getvalue().split("\n") if line]
    assert [re.split("\r", line)[-1][:7] for line in kept] == ["Epoch 0", "Epoch 1"]


def test_training_bar_starts_at_the_batches_a_resumed_run_already_did() -> None:
    out = io.StringIO()
    bar = TQDMProgressBar(mininterval=0, file=out)
    trainer = _trainer(num_training_batches=10, batch_idx_start=7)
    bar.on_train_epoch_start(trainer, MODULE)
    assert "7/10" in out.getvalue()
    for batch_idx in range(7, 10):
        bar.on_train_batch_end(trainer, MODULE, None, None, batch_idx)
    bar.on_train_epoch_end(trainer, MODULE)
    assert "10/10" in _final_line(out.getvalue())


def test_unknown_epoch_length_shows_a_plain_count() -> None:
    out = io.StringIO()
    bar = TQDMProgressBar(mininterval=0, file=out)
    _run_epoch(bar, _trainer(num_training_batches=float("inf")), batches=3)
    final = _final_line(out.getvalue())
    assert final.startswith("Epoch 0: 3it ")
    assert "%" not in final


def test_validation_bar_is_transient_and_its_metrics_reach_the_training_bar() -> None:
    out = io.StringIO()
    bar = TQDMProgressBar(mininterval=0, file=out)
    trainer = _trainer(num_training_batches=4, num_val_batches=[3])
    bar.on_train_epoch_start(trainer, MODULE)
    bar.on_train_batch_end(trainer, MODULE, None, None, 0)
    before = len(out.getvalue())
    trainer.progress_bar_metrics["val_loss"] = 2.0
    _run_validation(bar, trainer, batches=3)
    during = out.getvalue()[before:]
    assert "Validation DataLoader 0: 100%" in during
    assert "3/3" in during
    # Shown again right after validation, with the new metric, before any further batch.
    assert _final_line(during).startswith("Epoch 0:  25%")
    assert _final_line(during).rstrip().endswith("loss=1.230, val_loss=2.000]")


def test_standalone_validation_draws_only_the_validation_bar() -> None:
    out = io.StringIO()
    bar = TQDMProgressBar(mininterval=0, file=out)
    _run_validation(bar, _trainer(num_val_batches=[2]), batches=2)
    assert "Validation DataLoader 0: 100%" in _final_line(out.getvalue())  # kept
    assert "Epoch" not in out.getvalue()


def test_each_loader_restarts_the_bar_and_the_sanity_run_has_its_own_total() -> None:
    out = io.StringIO()
    bar = TQDMProgressBar(mininterval=0, file=out)
    trainer = _trainer(num_val_batches=[3, 2], num_sanity_val_batches=[2, 1], sanity_checking=True)
    _run_validation(bar, trainer, batches=[2, 1])
    text = out.getvalue()
    assert "Sanity Checking DataLoader 0: 100%" in text and "2/2" in text
    assert "Sanity Checking DataLoader 1: 100%" in text and "1/1" in text
    trainer.sanity_checking = False
    _run_validation(bar, trainer, batches=[3, 2])
    text = out.getvalue()
    assert "Validation DataLoader 0: 100%" in text and "3/3" in text
    assert "Validation DataLoader 1: 100%" in text and "2/2" in text


def test_test_and_predict_bars_stay_with_a_bar_per_loader() -> None:
    out = io.StringIO()
    bar = TQDMProgressBar(mininterval=0, file=out)
    trainer = _trainer(num_test_batches=[2], num_predict_batches=[1, 3])
    bar.on_test_start(trainer, MODULE)
    for batch_idx in range(2):
        bar.on_test_batch_start(trainer, MODULE, None, batch_idx)
        bar.on_test_batch_end(trainer, MODULE, None, None, batch_idx)
    bar.on_test_end(trainer, MODULE)
    assert _final_line(out.getvalue()).startswith("Testing DataLoader 0: 100%")
    bar.on_predict_start(trainer, MODULE)
    for dataloader_idx, count in enumerate([1, 3]):
        for batch_idx in range(count):
            bar.on_predict_batch_start(trainer, MODULE, None, batch_idx, dataloader_idx)
            bar.on_predict_batch_end(trainer, MODULE, None, None, batch_idx, dataloader_idx)
    bar.on_predict_end(trainer, MODULE)
    final = _final_line(out.getvalue())
    assert final.startswith("Predicting DataLoader 1: 100%") and "3/3" in final


def test_nothing_is_drawn_off_global_rank_zero() -> None:
    out = io.StringIO()
    bar = TQDMProgressBar(mininterval=0, file=out)
    trainer = _trainer(is_global_zero=False)
    _run_epoch(bar, trainer, batches=3)
    _run_validation(bar, trainer, batches=2)
    bar.on_train_end(trainer, MODULE)
    bar.teardown(trainer, MODULE, "fit")
    assert out.getvalue() == ""


def test_disable_stops_drawing_and_enable_resumes() -> None:
    out = io.StringIO()
    bar = TQDMProgressBar(mininterval=0, file=out)
    trainer = _trainer()
    bar.disable()
    assert not bar.is_enabled
    _run_epoch(bar, trainer, batches=3)
    assert out.getvalue() == ""
    bar.enable()
    _run_epoch(bar, trainer, batches=3)
    assert "Epoch 0" in out.getvalue()


def test_refresh_rate_advances_the_bar_in_steps_and_settles_at_epoch_end() -> None:
    out = io.StringIO()
    bar = TQDMProgressBar(refresh_rate=3, mininterval=0, file=out)
    _run_epoch(bar, _trainer(num_training_batches=10), batches=4)
    text = out.getvalue()
    assert "3/10" in text
    assert "1/10" not in text
    assert "2/10" not in text
    assert "4/10" in _final_line(text)


def test_postfix_is_formatted_only_when_the_bar_redraws() -> None:
    class CountingDict(dict[str, float]):
        reads = 0

        def items(self) -> Any:
            CountingDict.reads += 1
            return super().items()

    bar = TQDMProgressBar(mininterval=60, file=io.StringIO())
    trainer = _trainer(num_training_batches=1000, progress_bar_metrics=CountingDict(loss=1.0))
    _run_epoch(bar, trainer, batches=1000)
    # Drawn when opened and when closed; nothing in between with a 60 s minimum interval.
    assert CountingDict.reads <= 3


def test_exception_closes_the_bar() -> None:
    out = io.StringIO()
    bar = TQDMProgressBar(mininterval=0, file=out)
    trainer = _trainer()
    bar.on_train_epoch_start(trainer, MODULE)
    bar.on_train_batch_end(trainer, MODULE, None, None, 0)
    bar.on_exception(trainer, MODULE, RuntimeError("boom"))
    assert not bar.is_disabled
    closed = out.getvalue()
    assert closed.endswith("\n")
    bar.on_train_batch_end(trainer, MODULE, None, None, 1)
    bar.teardown(trainer, MODULE, "fit")
    assert out.getvalue() == closed


def test_refresh_rate_zero_hides_the_bar_for_good() -> None:
    out = io.StringIO()
    bar = TQDMProgressBar(refresh_rate=0, file=out)
    assert bar.is_disabled and not bar.is_enabled
    bar.enable()
    assert bar.is_disabled
    _run_epoch(bar, _trainer(), batches=3)
    _run_validation(bar, _trainer(), batches=2)
    assert out.getvalue() == ""


def test_the_base_bar_asks_a_subclass_to_say_how_to_disable() -> None:
    class Bar(ProgressBar):
        pass

    with pytest.raises(NotImplementedError, match=r"Bar must implement `disable\(\)`"):
        Bar().disable()
    with pytest.raises(TypeError, match=r"`Bar\.trainer` is not set yet"):
        _ = Bar().trainer


def test_invalid_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match=r"TQDMProgressBar\(refresh_rate=-1\): give an int >= 0"):
        TQDMProgressBar(refresh_rate=-1)
    with pytest.raises(ValueError, match=r"TQDMProgressBar\(process_position=-2\): give an int >= 0"):
        TQDMProgressBar(process_position=-2)
    with pytest.raises(ValueError, match=r"`mininterval` must be >= 0 seconds, got -1"):
        TQDMProgressBar(mininterval=-1)


def test_two_bars_or_a_hidden_bar_are_refused(tmp_path: Any) -> None:
    import fullshard

    with pytest.raises(
        MisconfigurationError, match=r"holds 2 progress bars \(TQDMProgressBar, TQDMProgressBar\)"
    ):
        fullshard.Trainer(default_root_dir=tmp_path, callbacks=[TQDMProgressBar(), TQDMProgressBar()])
    with pytest.raises(
        MisconfigurationError, match=r"enable_progress_bar=False\) was given a TQDMProgressBar"
    ):
        fullshard.Trainer(default_root_dir=tmp_path, callbacks=[TQDMProgressBar()], enable_progress_bar=False)
