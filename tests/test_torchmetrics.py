"""torchmetrics in ``self.log``: step values, epoch ``compute()`` then ``reset()``, the metric's
own cross-process sync (ddp, fsdp, fsdp2), ``log_dict(MetricCollection)``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from conftest import SCRIPTS, check_ok, quiet_trainer, run_script

torchmetrics = pytest.importorskip("torchmetrics")

sys.path.insert(0, str(SCRIPTS))
from torchmetrics_job import Classifier, make_data  # noqa: E402

from fullshard.callbacks import Callback  # noqa: E402


def _accuracy(model: Classifier, n: int, seed: int) -> float:
    x, y = make_data(n, seed).tensors
    with torch.no_grad():
        return float((model.layer(x).argmax(-1) == y).float().mean())


def _expected() -> dict[str, Any]:
    model = Classifier()
    x, y = make_data(20, 4).tensors
    with torch.no_grad():
        logits = model.layer(x)
    f1 = torchmetrics.functional.f1_score(logits, y, task="multiclass", num_classes=3, average="macro")
    return {
        "train_acc_epoch": _accuracy(model, 32, 1),
        "val_acc/dataloader_idx_0": _accuracy(model, 24, 2),
        "val_acc/dataloader_idx_1": _accuracy(model, 16, 3),
        "test": [{"test_acc": _accuracy(model, 20, 4), "test_f1": float(f1)}],
    }


def test_fullshard_does_not_import_torchmetrics() -> None:
    code = "import sys, fullshard, fullshard.callbacks; assert 'torchmetrics' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


class _StepValues(Callback):
    def __init__(self) -> None:
        self.step_values: list[tuple[float, float]] = []

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        x, y = batch
        with torch.no_grad():
            batch_acc = float((pl_module.layer(x).argmax(-1) == y).float().mean())
        self.step_values.append((float(trainer.callback_metrics["train_acc_step"]), batch_acc))


def test_step_value_is_the_batch_and_epoch_value_the_whole_epoch(tmp_path: Path) -> None:
    steps = _StepValues()
    trainer = quiet_trainer(tmp_path, max_epochs=2, num_sanity_val_steps=0, callbacks=[steps])
    model = Classifier()
    val = [DataLoader(make_data(24, 2), batch_size=4), DataLoader(make_data(16, 3), batch_size=4)]
    trainer.fit(model, DataLoader(make_data(32, 1), batch_size=4), val)
    assert len(steps.step_values) == 16
    assert len({b for _, b in steps.step_values}) > 1  # the batches differ, so the check can fail
    for logged, batch_acc in steps.step_values:
        assert logged == pytest.approx(batch_acc)
    expected = _expected()
    for key in ("train_acc_epoch", "val_acc/dataloader_idx_0", "val_acc/dataloader_idx_1"):
        assert float(trainer.callback_metrics[key]) == pytest.approx(expected[key]), key
    # reset after each epoch's values were logged
    assert model.train_acc.update_count == 0 and model.val_acc[1].update_count == 0
    assert trainer.test(model, DataLoader(make_data(20, 4), batch_size=5), verbose=False) == [
        pytest.approx(expected["test"][0])
    ]


def test_a_metric_only_updated_logs_no_step_value_but_its_epoch_value(tmp_path: Path) -> None:
    class Updated(Classifier):
        def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
            x, y = batch
            self.val_acc[0].update(self.layer(x), y)
            self.log("val_acc", self.val_acc[0], on_step=True, on_epoch=True)

    trainer = quiet_trainer(tmp_path)
    result = trainer.validate(Updated(), DataLoader(make_data(24, 2), batch_size=4), verbose=False)
    assert result == [{"val_acc_epoch": pytest.approx(_expected()["val_acc/dataloader_idx_0"])}]
    assert "val_acc_step" not in trainer.callback_metrics


def test_a_metric_logged_in_an_epoch_end_hook_is_computed_then_reset(tmp_path: Path) -> None:
    class AtEpochEnd(Classifier):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.val_acc[0].update(self.layer(x), y)

        def on_validation_epoch_end(self) -> None:
            self.log("val_acc", self.val_acc[0])

    model = AtEpochEnd()
    result = quiet_trainer(tmp_path).validate(
        model, DataLoader(make_data(24, 2), batch_size=4), verbose=False
    )
    assert result == [{"val_acc": pytest.approx(_expected()["val_acc/dataloader_idx_0"])}]
    assert model.val_acc[0].update_count == 0


def test_anything_else_that_is_not_a_number_is_refused(tmp_path: Path) -> None:
    class Bad(Classifier):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("val_acc", "high")

    with pytest.raises(
        TypeError,
        match=r"log\('val_acc'\) got a str; log a number, a one-element tensor or a torchmetrics.Metric",
    ):
        quiet_trainer(tmp_path).validate(Bad(), DataLoader(make_data(8, 2), batch_size=4), verbose=False)


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "fsdp2"])
def test_two_processes_compute_the_metric_over_the_data_of_both(tmp_path: Path, strategy: str) -> None:
    out = tmp_path / "out.json"
    check_ok(
        run_script(
            "torchmetrics_job.py", "--out", str(out), "--devices", "2", "--strategy", strategy, timeout=240
        )
    )
    got = json.loads(out.read_text())
    expected = _expected()
    assert got["counts"] == [0, 0]
    for epoch in got["epochs"]:
        for key in ("train_acc_epoch", "val_acc/dataloader_idx_0", "val_acc/dataloader_idx_1"):
            assert epoch[key] == pytest.approx(expected[key]), (strategy, key)
    assert got["test"] == [pytest.approx(expected["test"][0])]


def test_a_metric_logged_on_step_only_is_reset_at_the_end_of_the_epoch(tmp_path: Path) -> None:
    class StepOnly(Classifier):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            logits = self.layer(x)
            self.train_acc(logits, y)
            self.log("train_acc", self.train_acc, on_step=True, on_epoch=False)
            return torch.nn.functional.cross_entropy(logits, y)

    class Counts(Callback):
        def __init__(self) -> None:
            self.at_validation: list[int] = []

        def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
            self.at_validation.append(pl_module.train_acc.update_count)

    counts = Counts()
    model = StepOnly()
    trainer = quiet_trainer(
        tmp_path, max_epochs=1, val_check_interval=2, num_sanity_val_steps=0, callbacks=[counts]
    )
    trainer.fit(model, DataLoader(make_data(16, 1), batch_size=4), DataLoader(make_data(8, 2), batch_size=4))
    # a validation in the middle of the epoch leaves the training metric alone; the epoch's end resets it
    assert counts.at_validation == [2, 4]
    assert model.train_acc.update_count == 0
