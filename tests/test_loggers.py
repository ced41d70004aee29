"""Tests of the CSV and TensorBoard loggers."""

from __future__ import annotations

import csv
import json
import re
import sys
import warnings
from argparse import Namespace
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

import fullshard
from fullshard.trainer.loggers.base import Logger
from fullshard.trainer.loggers.csv_logger import CSVLogger
from fullshard.trainer.loggers.tensorboard import TensorBoardLogger


def _read(logger: CSVLogger) -> str:
    return Path(logger.log_dir, "metrics.csv").read_bytes().decode()


def test_csv_logger_touches_no_disk_before_the_first_write(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path / "logs")
    assert logger.name == "lightning_logs"
    assert logger.version == 0
    assert logger.log_dir == str(tmp_path / "logs" / "lightning_logs" / "version_0")
    logger.log_metrics({"loss": 1.0}, step=0)  # buffered
    assert not (tmp_path / "logs").exists()
    logger.save()
    assert Path(logger.log_dir, "metrics.csv").is_file()


def test_csv_rows_one_per_call_and_the_header_grows(tmp_path: Path) -> None:
    # Lightning's layout (the same file Lightning 2.6.6 writes, but for its "\r\n" line ends):
    # a row per call, also for the same step, and the columns sorted by name
    logger = CSVLogger(tmp_path)
    logger.log_metrics({"loss": 2.5}, step=0)
    logger.log_metrics({"lr": 0.1}, step=0)  # same step: a row of its own
    logger.log_metrics({"loss": 2.0}, step=1)
    logger.save()
    assert _read(logger) == "loss,lr,step\n2.5,,0\n,0.1,0\n2.0,,1\n"

    logger.log_metrics({"loss": 1.5}, step=2)
    logger.save()  # same columns: appended
    logger.log_metrics({"val_loss": 3.0, "loss": 1.25}, step=3)
    logger.finalize("success")  # new column: file rewritten under the wider header
    assert _read(logger) == ("loss,lr,step,val_loss\n2.5,,0,\n,0.1,0,\n2.0,,1,\n1.5,,2,\n1.25,,3,3.0\n")


def test_csv_flushes_on_its_own_once_enough_steps_are_buffered(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path, flush_logs_every_n_steps=2)
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.log_metrics({"loss": 2.0}, step=1)
    assert not Path(logger.log_dir).exists()
    logger.log_metrics({"loss": 3.0}, step=2)  # a third row: the two waiting ones go out first
    assert _read(logger) == "loss,step\n1.0,0\n2.0,1\n"
    logger.log_metrics({"acc": 0.5}, step=2)
    logger.save()
    assert _read(logger) == "acc,loss,step\n,1.0,0\n,2.0,1\n,3.0,2\n0.5,,2\n"


def test_csv_versions_count_up_and_can_be_named(tmp_path: Path) -> None:
    first = CSVLogger(tmp_path, name="exp")
    first.log_metrics({"loss": 1.0}, step=0)
    first.save()
    second = CSVLogger(tmp_path, name="exp")
    second.log_metrics({"loss": 1.0}, step=0)
    second.save()
    assert (first.version, second.version) == (0, 1)
    (tmp_path / "exp" / "version_7").mkdir()
    (tmp_path / "exp" / "not_a_version_9").mkdir()
    assert CSVLogger(tmp_path, name="exp").version == 8
    assert CSVLogger(tmp_path, name="exp", version=3).log_dir == str(tmp_path / "exp" / "version_3")
    assert CSVLogger(tmp_path, name="exp", version="baseline").log_dir == str(tmp_path / "exp" / "baseline")


def test_csv_resumed_run_appends_to_its_metrics_file(tmp_path: Path) -> None:
    before = CSVLogger(tmp_path, version=0)
    before.log_metrics({"loss": 1.0}, step=0)
    before.finalize("failed")
    after = CSVLogger(tmp_path, version=0)
    after.log_metrics({"loss": 0.5}, step=1)
    after.finalize("success")
    assert _read(after) == "loss,step\n1.0,0\n0.5,1\n"


def test_csv_hyperparameters_go_to_a_yaml_file(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path)
    logger.log_hyperparams({"lr": 0.001, "layers": 2, "name": "mlp"})
    logger.log_hyperparams(Namespace(lr=0.01))
    assert Path(logger.log_dir, "hparams.yaml").read_text() == "layers: 2\nlr: 0.01\nname: mlp\n"


def test_csv_logger_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"`flush_logs_every_n_steps` must be a positive integer, got 0"):
        CSVLogger(tmp_path, flush_logs_every_n_steps=0)
    with pytest.raises(
        ValueError, match=r"`version` must be a non-negative integer, a string or None, got -1"
    ):
        CSVLogger(tmp_path, version=-1)
    with pytest.raises(ValueError, match=r"The metric name 'step' is reserved"):
        CSVLogger(tmp_path).log_metrics({"step": 1.0}, step=1)


def test_finalize_saves_by_default() -> None:
    class Recording(Logger):
        saved = 0

        name = "recording"  # type: ignore[assignment]
        version = 0  # type: ignore[assignment]
        log_dir = "."  # type: ignore[assignment]

        def log_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...

        def log_hyperparams(self, params: Mapping[str, Any]) -> None: ...

        def save(self) -> None:
            self.saved += 1

    logger = Recording()
    logger.finalize("success")
    assert logger.saved == 1


def test_tensorboard_logger_without_tensorboard_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed
    with pytest.raises(
        ModuleNotFoundError,
        match=r"TensorBoardLogger needs the `tensorboard` package, which is not installed\. Install it with "
        r'`pip install "fullshard\[tensorboard\]"`',
    ):
        TensorBoardLogger(tmp_path)


def test_tensorboard_logger_writes_an_event_file(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorBoardLogger(tmp_path)
    assert not any(tmp_path.iterdir())
    logger.log_hyperparams({"lr": 0.1})
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.log_metrics({"loss": 0.5}, step=1)
    logger.finalize("success")
    run_dir = tmp_path / "lightning_logs" / "version_0"
    events = list(run_dir.glob("events.out.tfevents.*"))
    assert len(events) == 1
    accumulator = EventAccumulator(str(run_dir))
    accumulator.Reload()
    scalars = accumulator.Scalars("loss")
    assert [(event.step, event.value) for event in scalars] == [(0, 1.0), (1, 0.5)]
    assert (run_dir / "hparams.yaml").read_text() == "lr: 0.1\n"


# Lightning's rule (checked against Lightning 2.6.6): the epoch's batches, not its optimizer steps
# nor max_steps, against log_every_n_steps, each time fit builds its training loader
@pytest.mark.parametrize(
    ("kwargs", "times"),
    [
        ({"max_epochs": 1}, 1),
        ({"max_steps": 3, "log_every_n_steps": 10}, 0),  # 12 batches: not fewer, however few steps
        ({"max_steps": 3, "log_every_n_steps": 13}, 1),
        ({"max_epochs": 1, "accumulate_grad_batches": 4, "log_every_n_steps": 13}, 1),
        ({"max_steps": 3, "logger": False}, 0),
        ({"max_steps": 3, "iterable": True}, 0),  # no length: never fewer
        ({"max_epochs": 1, "limit_train_batches": 0}, 0),
        ({"max_epochs": 3, "reload_dataloaders_every_n_epochs": 1}, 3),  # at each build
        ({"max_epochs": 3, "reload_dataloaders_every_n_epochs": 2}, 2),
        ({"fast_dev_run": 2}, 0),
    ],
)
def test_an_epoch_shorter_than_the_logging_interval_says_so(
    tmp_path: Path, kwargs: dict[str, Any], times: int
) -> None:
    from torch.utils.data import DataLoader

    from ckpt_helpers import Net, make_data
    from conftest import quiet_trainer
    from fullshard.utilities.warnings import PossibleUserWarning

    iterable = kwargs.pop("iterable", False)
    data: Any = make_data()
    if iterable:  # no length: the epoch's steps are unknown
        data = _Stream(data)
    trainer = quiet_trainer(tmp_path, **{"logger": CSVLogger(tmp_path), **kwargs})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Net(), DataLoader(data, batch_size=8))
    found = [w for w in caught if "log_every_n_steps" in str(w.message)]
    assert len(found) == times, [str(w.message) for w in found]
    for w in found:
        assert w.category is PossibleUserWarning
        every = trainer.log_every_n_steps
        assert re.search(
            rf"The training epoch has 12 batch\(es\), fewer than Trainer\(log_every_n_steps={every}\)",
            str(w.message),
        )


class _Stream(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    def __init__(self, data: Any) -> None:
        self.data = data

    def __iter__(self) -> Any:
        return iter(self.data)


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "fsdp2"])
def test_a_users_logger_calls_write_from_rank_zero_only(tmp_path: Path, strategy: str) -> None:
    """The module calls log_hyperparams, log_metrics, experiment and save on both ranks: one run
    folder per logger, holding rank 0's values only; rank 1's experiment is a stand-in."""
    from conftest import check_ok, run_script

    check_ok(run_script("logger_ranks_job.py", "--out", str(tmp_path), "--strategy", strategy))
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert seen[0]["experiments"] == ["ExperimentWriter", "SummaryWriter"]
    assert seen[1]["experiments"] == ["DummyExperiment", "DummyExperiment"]
    assert seen[0]["log_dirs"] == seen[1]["log_dirs"]
    logs = tmp_path / "logs"
    assert sorted(p.name for p in (logs / "lightning_logs").iterdir()) == ["version_0"]
    assert sorted(p.name for p in (logs / "tb").iterdir()) == ["version_0"]
    csv_dir = logs / "lightning_logs" / "version_0"
    assert (csv_dir / "hparams.yaml").read_text() == "from_rank: 0\nhidden: 4\n"
    assert (
        logs / "tb" / "version_0" / "hparams.yaml"
    ).read_text() == "hidden: 4\n"  # written at the first save
    with (csv_dir / "metrics.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    # rank 0's value only, in a row of its own (one row per log_metrics call, as Lightning)
    assert [(row["step"], row["rank_metric"]) for row in rows if row["rank_metric"]] == [("0", "0.0")]


def _events(run_dir: Path) -> Any:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir), size_guidance={"tensors": 0, "scalars": 0})
    accumulator.Reload()
    return accumulator


def _hparams(events: Any) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict
    from tensorboard.plugins.hparams import plugin_data_pb2

    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    info = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    return {k: MessageToDict(v) for k, v in info.hparams.items()}


def test_tensorboard_prefix_sub_dir_and_hp_metric(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tensorboard")
    monkeypatch.setenv("RUN_GROUP", "g1")
    logger = TensorBoardLogger(tmp_path, name="tb", version=2, prefix="run", sub_dir="$RUN_GROUP/train")
    assert logger.log_dir == str(tmp_path / "tb" / "version_2" / "g1" / "train")
    logger.log_hyperparams({"lr": 0.1, "opt": {"name": "sgd"}})
    logger.log_metrics({"loss": 1.0, "pair": {"a": 1.0, "b": 2.0}}, step=3)
    logger.finalize("success")
    events = _events(Path(logger.log_dir))
    assert [(e.step, e.value) for e in events.Scalars("run-loss")] == [(3, 1.0)]
    assert [(e.step, e.value) for e in events.Scalars("run-hp_metric")] == [(0, -1.0)]
    assert _hparams(events) == {"lr": 0.1, "opt/name": "sgd"}  # flattened, in the HParams tab
    # a dict is a group of scalars (add_scalars): one event folder per member
    assert sorted(p.name for p in Path(logger.log_dir).glob("run-pair_*")) == ["run-pair_a", "run-pair_b"]
    assert [(e.step, e.value) for e in _events(Path(logger.log_dir, "run-pair_b")).Scalars("run-pair")] == [
        (3, 2.0)
    ]
    assert Path(logger.log_dir, "hparams.yaml").read_text() == "lr: 0.1\nopt:\n  name: sgd\n"

    quiet = TensorBoardLogger(tmp_path, name="quiet", default_hp_metric=False)
    quiet.log_hyperparams({"lr": 0.1})  # no metric: nothing for TensorBoard's HParams tab
    quiet.log_hyperparams({"lr": 0.2}, metrics={"best": 0.5}, step=1)
    quiet.finalize("success")
    events = _events(Path(quiet.log_dir))
    assert "hp_metric" not in events.Tags()["scalars"]
    assert [(e.step, e.value) for e in events.Scalars("best")] == [(1, 0.5)]
    with pytest.raises(ValueError, match=r"TensorBoardLogger cannot log loss='high': log a number"):
        quiet.log_metrics({"loss": "high"}, step=0)


class _Graphed(fullshard.LightningModule):
    def __init__(self, example: Any = None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.example_input_array = example

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch[0]).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_tensorboard_log_graph_traces_the_example_input_when_fit_starts(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from torch.utils.data import DataLoader, TensorDataset

    from conftest import quiet_trainer

    data = DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2)
    logger = TensorBoardLogger(tmp_path, log_graph=True)
    quiet_trainer(tmp_path, logger=logger, max_steps=1).fit(_Graphed(torch.randn(3, 2)), data)
    assert _events(Path(logger.log_dir)).Graph() is not None
    assert (
        Path(logger.log_dir, "hparams.yaml").read_text() == "{}\n"
    )  # written at the start's save, as Lightning

    off = TensorBoardLogger(tmp_path, name="off")  # log_graph=False: no graph
    quiet_trainer(tmp_path, logger=off, max_steps=1).fit(_Graphed(torch.randn(3, 2)), data)
    with pytest.raises(ValueError, match="There is no graph in this EventAccumulator"):
        _events(Path(off.log_dir)).Graph()

    missing = TensorBoardLogger(tmp_path, name="missing", log_graph=True)
    with pytest.warns(UserWarning, match=r"logs no graph: the module's `example_input_array` is not set"):
        quiet_trainer(tmp_path, logger=missing, max_steps=1).fit(_Graphed(), data)
    with pytest.warns(
        UserWarning, match=r"logs no graph: the input is a list, which TensorBoard cannot trace"
    ):
        missing.log_graph(_Graphed(), [torch.randn(1, 2)])


def test_csv_prefix_step_default_and_experiment_writer(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path, name=None, prefix="run")
    assert logger.log_dir == str(tmp_path / "version_0")  # no name: versions right under save_dir
    logger.log_metrics({"loss": 1.0})  # no step: the count of rows so far
    logger.log_metrics({"loss": 0.5})
    writer = logger.experiment
    assert writer.metrics_file_path == str(tmp_path / "version_0" / "metrics.csv")
    writer.log_metrics({"acc": 0.25}, step=1)  # the writer takes names as given
    writer.log_hparams({"seed": 3})
    logger.save()
    assert _read(logger) == "acc,run-loss,step\n,1.0,0\n,0.5,1\n0.25,,1\n"
    assert writer.hparams == {"seed": 3}


class _WithHparams(fullshard.LightningModule):
    def __init__(self, lr: float = 0.1, width: int = 2) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(2, 1)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val", self.layer(batch[0]).sum())


class _Data(fullshard.LightningDataModule):
    def __init__(self, width: int = 2, batch_size: int = 2) -> None:
        super().__init__()
        self.save_hyperparameters()

    def val_dataloader(self) -> Any:
        from torch.utils.data import DataLoader, TensorDataset

        return DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=self.hparams.batch_size)


def test_every_call_logs_the_module_and_datamodule_hyperparameters(tmp_path: Path) -> None:
    from conftest import quiet_trainer

    logger = CSVLogger(tmp_path)
    quiet_trainer(tmp_path, logger=logger).validate(_WithHparams(), datamodule=_Data())
    assert Path(logger.log_dir, "hparams.yaml").read_text() == "batch_size: 2\nlr: 0.1\nwidth: 2\n"

    off = CSVLogger(tmp_path, name="off")
    quiet_trainer(tmp_path, logger=off, enable_autolog_hparams=False).validate(
        _WithHparams(), datamodule=_Data()
    )
    assert not Path(off.log_dir, "hparams.yaml").exists()

    with pytest.raises(
        RuntimeError,
        match=r"The module's and the datamodule's hyperparameters both have \['width'\], with different values",
    ):
        quiet_trainer(tmp_path, logger=CSVLogger(tmp_path)).validate(
            _WithHparams(), datamodule=_Data(width=3)
        )


def test_hyperparameters_must_be_a_mapping(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"Hyperparameters must be a dict \(or a Namespace\), got list"):
        CSVLogger(tmp_path).log_hyperparams([("lr", 0.1)])  # type: ignore[arg-type]


def test_fast_dev_run_gives_user_code_a_logger_that_writes_nothing(tmp_path: Path) -> None:
    from torch.utils.data import DataLoader, TensorDataset

    from conftest import quiet_trainer
    from fullshard.callbacks import LearningRateMonitor
    from fullshard.trainer.loggers.base import DummyLogger

    class Calls(_Graphed):
        def on_train_start(self) -> None:
            self.logger.log_hyperparams({"a": 1})
            self.logger.experiment.add_text("t", "x")
            self.loggers[0].log_image(key="k", images=[])  # a method only some loggers have

    data = DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2)
    trainer = quiet_trainer(
        tmp_path, fast_dev_run=1, logger=CSVLogger(tmp_path), callbacks=[LearningRateMonitor()]
    )
    trainer.fit(Calls(), data)
    assert isinstance(trainer.logger, DummyLogger) and trainer.log_dir == str(tmp_path)
    assert not any(tmp_path.iterdir())
    assert quiet_trainer(tmp_path, fast_dev_run=1, logger=False).loggers == []
