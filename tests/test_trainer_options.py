"""Lightning's Trainer options ``max_time``, ``profiler``, ``sync_batchnorm``, ``overfit_batches`` and
``reload_dataloaders_every_n_epochs``: behaviour compared with Lightning 2.6.6 (the expected call
counts and batch counts below were recorded from it for the same scripts), multi-process parts
with real processes (tests/scripts/options_job.py)."""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import fullshard
from conftest import SCRIPTS, check_ok, quiet_trainer, run_script
from fullshard.callbacks import Callback, ModelCheckpoint, Timer
from fullshard.errors import MisconfigurationError
from fullshard.profilers import AdvancedProfiler, PassThroughProfiler, PyTorchProfiler, SimpleProfiler
from fullshard.strategies.sync_batchnorm import CPUSyncBatchNorm, convert_sync_batchnorm
from fullshard.trainer.callbacks.timer import parse_duration


class Net(fullshard.LightningModule):
    """Counts its dataloader calls (with the epoch) and the first sample of each training batch."""

    def __init__(self, sleep: float = 0.0) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.sleep = sleep
        self.calls: list[tuple[str, int]] = []
        self.first_samples: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.sleep:
            time.sleep(self.sleep)
        self.first_samples.append(float(batch[0][0, 0]))
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("v", self.layer(batch[0]).mean())

    def on_train_epoch_end(self) -> None:
        pass

    def train_dataloader(self) -> DataLoader[Any]:
        self.calls.append(("train", self.trainer.current_epoch))
        return DataLoader(TensorDataset(torch.arange(128.0).view(32, 4) / 128), batch_size=4, shuffle=True)

    def val_dataloader(self) -> DataLoader[Any]:
        self.calls.append(("val", self.trainer.current_epoch))
        return DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=4)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


# ------------------------------------------------------------------------------ max_time
@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("00:12:00:00", timedelta(hours=12)),
        ("01:02:03:04", timedelta(days=1, hours=2, minutes=3, seconds=4)),
        ({"minutes": 5, "seconds": 2}, timedelta(minutes=5, seconds=2)),
        (timedelta(seconds=9), timedelta(seconds=9)),
        (None, None),
    ],
)
def test_max_time_takes_lightnings_three_forms(given: Any, expected: timedelta | None) -> None:
    assert parse_duration(given) == expected


@pytest.mark.parametrize("bad", ["12:00:00", "1 hour", 3600, {"hour": 1}])
def test_a_bad_max_time_says_which_forms_are_accepted(bad: Any) -> None:
    with pytest.raises(MisconfigurationError, match=r"max_time=.* (is invalid|is not a valid dict).*'hours'"):
        fullshard.Trainer(accelerator="cpu", devices=1, logger=False, max_time=bad)


def test_max_time_adds_a_timer_and_lifts_the_epoch_limit(tmp_path: Path) -> None:
    timed = quiet_trainer(tmp_path, max_time="00:00:01:00")
    assert [type(cb) for cb in timed.callbacks].count(Timer) == 1 and timed.max_epochs == -1
    assert quiet_trainer(tmp_path).max_epochs == 1000  # Lightning's default without a time limit
    own = Timer(duration={"seconds": 5})
    given = quiet_trainer(tmp_path, max_time="00:00:01:00", callbacks=[own])
    assert [cb for cb in given.callbacks if isinstance(cb, Timer)] == [own]  # max_time ignored, as Lightning
    with pytest.raises(MisconfigurationError, match=r"interval='minute'.* use 'step'"):
        Timer(duration="00:00:01:00", interval="minute")


def test_max_time_stops_saves_last_and_resumes_the_elapsed_time(tmp_path: Path) -> None:
    data = DataLoader(TensorDataset(torch.randn(400, 4)), batch_size=2)
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True, save_top_k=0)
    trainer = quiet_trainer(
        tmp_path, max_time={"milliseconds": 300}, callbacks=[ckpt], enable_checkpointing=True
    )
    model = Net(sleep=0.02)
    trainer.fit(model, data)
    steps = trainer.global_step
    assert trainer.should_stop and 5 <= steps < 200, steps  # stopped by the time, inside the first epoch
    timer = next(cb for cb in trainer.callbacks if isinstance(cb, Timer))
    assert 0.3 <= timer.time_elapsed() < 3.0 and timer.time_remaining() is not None
    saved = torch.load(tmp_path / "last.ckpt", weights_only=False)
    elapsed = saved["callbacks"]["Timer"]["time_elapsed"]["train"]
    assert elapsed >= 0.3 and saved["global_step"] == steps  # saved at the stop

    # the same limit again: the checkpoint used it up, nothing more is trained
    again = quiet_trainer(tmp_path, max_time={"milliseconds": 300})
    again.fit(Net(sleep=0.02), data, ckpt_path=tmp_path / "last.ckpt")
    assert again.global_step == steps
    # a longer limit: training goes on, and the time counts from the checkpoint's
    longer = quiet_trainer(tmp_path, max_time={"milliseconds": 600})
    longer.fit(Net(sleep=0.02), data, ckpt_path=tmp_path / "last.ckpt")
    resumed = next(cb for cb in longer.callbacks if isinstance(cb, Timer))
    assert longer.global_step > steps and resumed.time_elapsed() >= 0.6


@pytest.mark.multiprocess
def test_max_time_stops_every_rank_at_the_same_step_and_resumes(tmp_path: Path) -> None:
    check_ok(run_script("options_job.py", "--out", str(tmp_path), "--mode", "timer", timeout=240))
    seen = [json.loads((tmp_path / f"timer{rank}.json").read_text()) for rank in (0, 1)]
    assert seen[0]["global_step"] == seen[1]["global_step"] > 0
    assert seen[0]["resumed_step"] == seen[1]["resumed_step"] > seen[0]["global_step"]
    for rank in seen:
        assert rank["should_stop"] and rank["max_epochs"] == -1 and rank["last"].endswith("last.ckpt")
        assert 1.0 <= rank["elapsed"] < 4.0  # the limit, plus the agreement's few steps
        assert rank["resumed_elapsed"] >= 2.0  # the first run's time counted


# ------------------------------------------------------------------------------ profilers
class Noop(Callback):
    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # the profiler times at the Trainer's dispatch: nothing shadows the strategy's methods
        # or the fit loop's (as the attribute replacement it once did)
        shadowed = {"batch_to_device", "training_step", "backward", "optimizer_step"} & set(
            vars(trainer.strategy)
        )
        self.patched = (
            bool(shadowed) or "run_epoch" in vars(trainer.fit_loop) or "save_checkpoint" in vars(trainer)
        )


def test_simple_profiler_writes_lightnings_actions_to_the_log_dir(tmp_path: Path) -> None:
    noop = Noop()
    trainer = quiet_trainer(
        tmp_path, max_epochs=2, profiler="simple", callbacks=[noop], enable_checkpointing=True
    )
    trainer.fit(Net())
    report = (tmp_path / "fit-profiler.txt").read_text()
    rows = {
        line.split("|")[1].strip(): line.split("|") for line in report.splitlines() if line.startswith("|  ")
    }
    assert report.startswith("FIT Profiler Report")
    assert int(rows["[Strategy]SingleDeviceStrategy.training_step"][3]) == 16  # 8 batches x 2 epochs
    assert int(rows["[Strategy]SingleDeviceStrategy.backward"][3]) == 16
    assert int(rows["[Strategy]SingleDeviceStrategy.optimizer_step"][3]) == 16
    assert int(rows["[Strategy]SingleDeviceStrategy.validation_step"][3]) == 2 + 2 * 4  # sanity + 2 epochs
    assert int(rows["[Callback]Noop.on_train_batch_end"][3]) == 16
    assert int(rows["[LightningModule]Net.on_train_epoch_end"][3]) == 2
    assert int(rows["run_training_epoch"][3]) == 2
    assert int(rows["save_checkpoint"][3]) == 2  # ModelCheckpoint, once an epoch
    assert noop.patched is False
    trainer.validate(Net())
    assert (tmp_path / "validate-profiler.txt").read_text().startswith("VALIDATE Profiler Report")


def test_a_profiler_times_steps_of_several_evaluation_dataloaders(tmp_path: Path) -> None:
    class TwoLoaders(Net):
        def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
            self.log("v", self.layer(batch[0]).mean())

    loader = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4)
    quiet_trainer(tmp_path, profiler="simple").validate(TwoLoaders(), [loader, loader])
    report = (tmp_path / "validate-profiler.txt").read_text()
    row = next(line for line in report.splitlines() if "SingleDeviceStrategy.validation_step" in line)
    assert int(row.split("|")[3]) == 4  # 2 batches of each loader, dataloader_idx passed through


def test_no_profiler_wraps_nothing(tmp_path: Path) -> None:
    noop = Noop()
    trainer = quiet_trainer(tmp_path, max_epochs=1, callbacks=[noop])
    assert isinstance(trainer.profiler, PassThroughProfiler)
    trainer.fit(Net())
    assert noop.patched is False and not list(tmp_path.glob("*profiler*"))


def test_simple_profiler_file_name_and_user_actions(tmp_path: Path) -> None:
    class Timed(Net):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            with self.trainer.profiler.profile("my_action"):
                return super().training_step(batch, batch_idx)

    trainer = quiet_trainer(
        tmp_path, max_epochs=1, profiler=SimpleProfiler(dirpath=tmp_path / "p", filename="perf")
    )
    trainer.fit(Timed())
    report = (tmp_path / "p" / "fit-perf.txt").read_text()
    assert "my_action" in report and "Mean duration (s)" in report
    with pytest.raises(ValueError, match="which was never started"):
        SimpleProfiler().stop("never")


def test_advanced_profiler_reports_cprofile_stats_per_action(tmp_path: Path) -> None:
    trainer = quiet_trainer(tmp_path, max_epochs=1, profiler=AdvancedProfiler(filename="adv"))
    trainer.fit(Net())
    report = (tmp_path / "fit-adv.txt").read_text()
    assert "Profile stats for: [Strategy]SingleDeviceStrategy.training_step" in report
    assert "Ordered by: cumulative time" in report and "training_step" in report


def test_pytorch_profiler_writes_a_chrome_trace(tmp_path: Path) -> None:
    trainer = quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=2, profiler="pytorch")
    trainer.fit(Net())
    trace = json.loads((tmp_path / "fit-profiler.pt.trace.json").read_text())
    names = {event.get("name") for event in trace["traceEvents"]}
    assert "[Strategy]SingleDeviceStrategy.training_step" in names and "aten::linear" in names
    assert "Self CPU" in (tmp_path / "fit-profiler.txt").read_text()
    assert isinstance(fullshard.profilers.resolve_profiler("PyTorch"), PyTorchProfiler)


def test_a_bad_profiler_lists_the_choices() -> None:
    with pytest.raises(
        MisconfigurationError,
        match=r"profiler='fast' is invalid: use None, one of \['advanced', 'pytorch', 'simple'\]",
    ):
        fullshard.Trainer(accelerator="cpu", devices=1, profiler="fast")


# ------------------------------------------------------------------------ sync_batchnorm
def _syncbn_reference(per_rank: bool) -> dict[str, torch.Tensor]:
    """One process: BatchNorm over each step's global batch (both ranks' batches), or, with
    ``per_rank``, over each rank's half apart (what unsynchronised DDP computes)."""
    sys.path.insert(0, str(SCRIPTS))
    from options_job import BATCH, LR, STEPS, syncbn_data, syncbn_layers

    net = syncbn_layers()
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    x, y = syncbn_data().tensors
    for step in range(STEPS):
        xb, yb = x[2 * step * BATCH : 2 * (step + 1) * BATCH], y[2 * step * BATCH : 2 * (step + 1) * BATCH]
        optimizer.zero_grad()
        if per_rank:  # rank r reads samples r, r+2, ...: its half of the global batch
            loss = sum(F.mse_loss(net(xb[r::2]), yb[r::2]) for r in (0, 1)) / 2
        else:
            loss = F.mse_loss(net(xb), yb)
        loss.backward()
        optimizer.step()
    return {f"net.{k}": v for k, v in net.state_dict().items()}


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_sync_batchnorm_equals_one_batchnorm_over_the_global_batch(tmp_path: Path, strategy: str) -> None:
    check_ok(
        run_script(
            "options_job.py", "--out", str(tmp_path), "--mode", "syncbn", "--strategy", strategy, timeout=240
        )
    )
    saved = torch.load(tmp_path / "syncbn.pt", weights_only=False)
    assert saved["kinds"] == ["CPUSyncBatchNorm1d"]
    state, synced, apart = saved["state"], _syncbn_reference(False), _syncbn_reference(True)
    for key, value in synced.items():
        assert torch.allclose(state[key].float(), value.float(), atol=1e-5), key
    assert not torch.allclose(
        state["net.1.running_var"], apart["net.1.running_var"], atol=1e-3
    )  # the test can fail
    assert not torch.allclose(state["net.0.weight"], apart["net.0.weight"], atol=1e-5)
    # profiler="simple" in the same job: every rank writes its own report
    assert (tmp_path / "fit-profiler-0.txt").exists() and (tmp_path / "fit-profiler-1.txt").exists()


def test_sync_batchnorm_is_left_off_with_one_process_and_checked(tmp_path: Path) -> None:
    model = nn.Sequential(nn.BatchNorm2d(3))
    converted = convert_sync_batchnorm(model, torch.device("cpu"))
    assert isinstance(converted[0], CPUSyncBatchNorm) and isinstance(converted[0], nn.BatchNorm2d)
    x = torch.randn(4, 3, 2, 2)
    assert torch.allclose(converted(x), nn.BatchNorm2d(3)(x), atol=1e-6)  # no process group: a BatchNorm
    trainer = quiet_trainer(tmp_path, sync_batchnorm=True)
    assert trainer.strategy.sync_batchnorm and trainer.strategy.convert_sync_batchnorm(model) is model
    with pytest.raises(MisconfigurationError, match="sync_batchnorm='yes' is invalid: use True or False"):
        quiet_trainer(tmp_path, sync_batchnorm="yes")


# ---------------------------------------------------------------- overfit and reloading
def test_overfit_batches_uses_the_same_unshuffled_batches_each_epoch(tmp_path: Path) -> None:
    model = Net()
    trainer = quiet_trainer(tmp_path, max_epochs=2, overfit_batches=2)
    with pytest.warns(UserWarning, match="You requested to overfit but enabled train dataloader shuffling"):
        trainer.fit(model)
    assert trainer.num_training_batches == 2 and trainer.num_val_batches == [2]  # as Lightning
    assert model.first_samples == [0.0, 0.125, 0.0, 0.125]  # in order, and again
    fraction = quiet_trainer(tmp_path, max_epochs=1, overfit_batches=0.5)
    fraction.fit(Net())
    assert fraction.num_training_batches == 4 and fraction.num_val_batches == [2]  # as Lightning
    with pytest.raises(MisconfigurationError, match=r"overfit_batches=1.5 is a float above 1.0"):
        quiet_trainer(tmp_path, overfit_batches=1.5)


@pytest.mark.parametrize(
    ("option", "message"),
    [  # Lightning 2.6.6 raises MisconfigurationException for both
        (
            "limit_train_batches",
            r"limit_train_batches=0.1 of the train dataloader's 8 batch\(es\) .*0.1 \* 8 < 1",
        ),
        ("limit_val_batches", r"limit_val_batches=0.2 of the val dataloader's 4 batch\(es\) .*0.2 \* 4 < 1"),
    ],
)
def test_a_limit_fraction_below_one_batch_is_refused(tmp_path: Path, option: str, message: str) -> None:
    fraction = 0.1 if option == "limit_train_batches" else 0.2
    trainer = quiet_trainer(tmp_path, max_epochs=1, **{option: fraction})
    with pytest.raises(MisconfigurationError, match=message + r".*Pass at least " + option + r"=0.(125|25)"):
        trainer.fit(Net())


@pytest.mark.parametrize(
    ("options", "expected"),
    [  # recorded from Lightning 2.6.6 with the same module
        (
            dict(max_epochs=5, reload_dataloaders_every_n_epochs=2),
            [("val", 0), ("train", 0), ("train", 2), ("val", 2), ("train", 4), ("val", 4)],
        ),
        (
            dict(max_epochs=3, reload_dataloaders_every_n_epochs=1),
            [("val", 0), ("train", 0), ("train", 1), ("val", 1), ("train", 2), ("val", 2)],
        ),
        (dict(max_epochs=3), [("val", 0), ("train", 0)]),
    ],
)
def test_reload_dataloaders_every_n_epochs_calls_them_as_lightning(
    tmp_path: Path, options: dict[str, Any], expected: list[tuple[str, int]]
) -> None:
    model = Net()
    quiet_trainer(tmp_path, **options).fit(model)
    assert model.calls == expected


def test_reload_dataloaders_counts_from_the_resumed_epoch(tmp_path: Path) -> None:
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    first = Net()
    quiet_trainer(tmp_path, max_epochs=3, reload_dataloaders_every_n_epochs=2, callbacks=[ckpt],
                  enable_checkpointing=True).fit(first)  # fmt: skip
    resumed = Net()
    trainer = quiet_trainer(tmp_path, max_epochs=6, reload_dataloaders_every_n_epochs=2)
    trainer.fit(resumed, ckpt_path=tmp_path / "last.ckpt")
    # Lightning 2.6.6: the resumed fit builds its loaders at epoch 2 (the checkpoint's), then at 4
    assert resumed.calls == [("val", 2), ("train", 2), ("train", 4), ("val", 4)]
    assert trainer.current_epoch == 6


def test_bad_reload_value_is_refused(tmp_path: Path) -> None:
    with pytest.raises(
        MisconfigurationError, match=r"reload_dataloaders_every_n_epochs=-1 is invalid: use an int >= 0"
    ):
        quiet_trainer(tmp_path, reload_dataloaders_every_n_epochs=-1)
