"""WandbLogger, MLFlowLogger and CometLogger against their real packages and backends: W&B and
Comet in their offline modes, MLflow against a tracking server started here on 127.0.0.1 with a
SQLite store. Each test trains a tiny module with the tracker beside a CSVLogger and reads back,
through the tracker's own package (tests/porting/backends.py), that it holds the same metrics at
the same steps and the module's hyperparameters."""

from __future__ import annotations

import csv
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import fullshard
from conftest import quiet_trainer
from fullshard.loggers import CometLogger, CSVLogger, MLFlowLogger, WandbLogger

sys.path.insert(0, str(Path(__file__).parent / "porting"))
from backends import MLflowServer, read_comet_offline, read_mlflow_run, read_wandb_offline

STEPS = 4


class Tiny(fullshard.LightningModule):
    def __init__(self, hidden: int = 3, lr: float = 0.1, name: str = "tiny") -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(2, hidden), nn.Linear(hidden, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def _fit(tmp_path: Path, tracker: Any) -> list[dict[str, str]]:
    """Train with ``tracker`` and a CSVLogger; the CSV's rows (what the tracker must hold too)."""
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(16, 2), torch.randn(16, 1))
    local = CSVLogger(tmp_path / "csv", flush_logs_every_n_steps=1)
    trainer = quiet_trainer(tmp_path, logger=[tracker, local], max_steps=STEPS, log_every_n_steps=1)
    trainer.fit(Tiny(), DataLoader(data, batch_size=4))
    with open(Path(local.log_dir, "metrics.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == list(range(STEPS))
    return rows


HPARAMS = {"hidden": 3, "lr": 0.1, "name": "tiny"}


def test_wandb_offline_run_holds_the_metrics_and_hyperparameters(tmp_path: Path) -> None:
    pytest.importorskip(
        "wandb", reason="WandbLogger is tested with the wandb package (the test extra has it)"
    )
    logger = WandbLogger(save_dir=tmp_path, offline=True, project="fullshard-test", name="tiny-run")
    assert logger.name == "fullshard-test" and logger.version is None and logger.save_dir == str(tmp_path)
    rows = _fit(tmp_path, logger)
    run_id = logger.version
    logger.experiment.finish()
    run = read_wandb_offline(tmp_path)
    assert (run["id"], run["project"], run["name"]) == (run_id, "fullshard-test", "tiny-run")
    assert run["config"] == HPARAMS
    logged = [(h["trainer/global_step"], h["train/loss"], h["epoch"]) for h in run["history"]]
    assert logged == [(int(r["step"]), float(r["train/loss"]), float(r["epoch"])) for r in rows]


def test_comet_offline_experiment_holds_the_metrics_and_hyperparameters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip(
        "comet_ml", reason="CometLogger is tested with the comet_ml package (the test extra has it)"
    )
    monkeypatch.setenv("COMET_DISABLE_AUTO_LOGGING", "1")  # the logger sets it; the test puts it back
    offline = tmp_path / "comet"
    logger = CometLogger(
        online=False, project="fullshard-test", offline_directory=str(offline), name="tiny-run"
    )
    assert logger.version is None and logger.save_dir == str(offline)
    rows = _fit(tmp_path, logger)
    assert logger.name == "fullshard-test" and logger.version is not None
    logger.experiment.end()  # writes the offline archive
    experiment = read_comet_offline(offline)
    assert experiment["project"] == "fullshard-test"
    assert experiment["others"]["Name"] == "tiny-run" and experiment["others"]["Created from"] == "fullshard"
    assert experiment["params"] == HPARAMS
    logged = [
        (step, value, epoch) for name, value, step, epoch in experiment["metrics"] if name == "train/loss"
    ]
    assert logged == [(int(r["step"]), float(r["train/loss"]), float(r["epoch"])) for r in rows]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MLflowServer]:
    pytest.importorskip(
        "mlflow", reason="MLFlowLogger is tested with the mlflow package (the test extra has it)"
    )
    server = MLflowServer(tmp_path_factory.mktemp("mlflow"))
    try:
        yield server
    finally:
        server.stop()


def test_mlflow_run_on_a_tracking_server_holds_the_metrics_and_hyperparameters(
    tmp_path: Path, mlflow_server: MLflowServer
) -> None:
    logger = MLFlowLogger(
        experiment_name="fullshard-test",
        run_name="tiny-run",
        tracking_uri=mlflow_server.uri,
        tags={"team": "x"},
    )
    assert logger.save_dir is None  # not a local store
    rows = _fit(tmp_path, logger)
    run = read_mlflow_run(mlflow_server.uri, logger.run_id)
    assert run["status"] == "FINISHED" and run["experiment"] == "fullshard-test"
    assert run["tags"]["mlflow.runName"] == "tiny-run" and run["tags"]["team"] == "x"
    assert run["params"] == {k: str(v) for k, v in HPARAMS.items()}
    assert run["metrics"]["train/loss"] == [(int(r["step"]), float(r["train/loss"])) for r in rows]
    assert logger.name == logger.experiment_id and logger.version == logger.run_id

    # MLflow's rule for metric names, and string values skipped
    with pytest.warns(RuntimeWarning, match=r"in metric names: logging 'val@acc' as 'valacc'"):
        logger.log_metrics({"val@acc": 0.5, "note": "text"}, step=9)
    after = read_mlflow_run(mlflow_server.uri, logger.run_id)["metrics"]
    assert after["valacc"] == [(9, 0.5)] and "note" not in after


@pytest.mark.parametrize(
    ("make", "package", "extra"),
    [
        (lambda: WandbLogger(offline=True), "wandb", "wandb"),
        (lambda: MLFlowLogger(), "mlflow", "mlflow"),
        (lambda: CometLogger(online=False), "comet_ml", "comet"),
    ],
)
def test_a_tracker_without_its_package_names_the_extra(
    make: Any, package: str, extra: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, package, None)  # as if not installed
    with pytest.raises(
        ModuleNotFoundError,
        match=rf'needs the `{package}` package, which is not installed\. Install it with `pip install "fullshard\[{extra}\]"`',
    ):
        make()


def test_tracker_arguments_fullshard_refuses(tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    with pytest.raises(
        ValueError, match=r"WandbLogger\(log_model=True, offline=True\): checkpoints cannot be uploaded"
    ):
        WandbLogger(offline=True, log_model=True)
    with pytest.raises(ValueError, match=r"WandbLogger\(log_model='all'\) is not supported by fullshard yet"):
        WandbLogger(log_model="all")
    with pytest.raises(ValueError, match=r"MLFlowLogger\(log_model=True\) is not supported by fullshard yet"):
        MLFlowLogger(save_dir=str(tmp_path), log_model=True)


def test_comet_takes_lightnings_older_argument_names(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("comet_ml")
    monkeypatch.setenv("COMET_DISABLE_AUTO_LOGGING", "1")
    with pytest.warns(
        DeprecationWarning, match=r"CometLogger\(project_name=\.\.\.\) is an old name: pass project="
    ):
        logger = CometLogger(project_name="p", experiment_name="run", save_dir="offline", offline=True)
    assert (logger.name, logger.save_dir, logger.version) == ("p", "offline", None)  # nothing started yet
    assert logger._online is False and logger._comet_config.name == "run"
    with pytest.raises(
        ValueError, match=r"`mode` must be None, 'get_or_create', 'get' or 'create', got 'new'"
    ):
        CometLogger(mode="new")  # type: ignore[arg-type]
