"""Porting script: training that logs to CSV, TensorBoard, MLflow (a SQLite store) and W&B
(offline) at once, with hyperparameters from the module and the datamodule, and user code that
calls the logger on every rank; each backend is read back through its own package.

Covers: ``CSVLogger`` (``hparams.yaml``, ``metrics.csv``), ``TensorBoardLogger`` (scalars,
``hp_metric``, ``hparams.yaml``, the HParams tab), ``MLFlowLogger(tracking_uri=, run_name=,
tags=)`` (params, metric history, run status), ``WandbLogger(offline=True)`` (config, history
with ``trainer/global_step``), ``save_hyperparameters`` in a module and a datamodule (merged for
the loggers), ``self.logger.log_hyperparams`` called on every rank (rank 0's only counts),
``trainer.log_dir``, ``ModelCheckpoint``'s default folder under the first logger, a logger
``prefix``; checked against each other and against the run's own values.

    PORT_FRAMEWORK=fullshard python tests/porting/logger_backends.py --strategy fsdp --out /tmp/p20
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from backends import read_mlflow_run, read_wandb_offline
from recording import RecordCallbackHooks, RecordModuleHooks, check, close, mark, run, value
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FRAMEWORK = os.environ.get("PORT_FRAMEWORK", "fullshard")
if FRAMEWORK == "lightning":
    import lightning.pytorch as L
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger, MLFlowLogger, TensorBoardLogger, WandbLogger
else:
    import fullshard as L
    from fullshard.callbacks import Callback, ModelCheckpoint
    from fullshard.loggers import CSVLogger, MLFlowLogger, TensorBoardLogger, WandbLogger

SEED, BATCH = 5, 4


def make_data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    return TensorDataset(x, x.sum(dim=1, keepdim=True))


class Data(L.LightningDataModule):
    def __init__(self, batch_size: int = BATCH, samples: int = 32) -> None:
        super().__init__()
        self.save_hyperparameters()

    def train_dataloader(self):
        return DataLoader(
            make_data(self.hparams.samples, 1), batch_size=self.hparams.batch_size, shuffle=True
        )

    def val_dataloader(self):
        return DataLoader(make_data(16, 2), batch_size=self.hparams.batch_size)


class Regressor(RecordModuleHooks, L.LightningModule):
    def __init__(self, hidden: int = 6, lr: float = 0.05, activation: str = "tanh") -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(3, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def on_train_start(self):
        # user code runs on every rank; only rank 0's call may reach the loggers
        self.logger.log_hyperparams({"called_from_rank": self.global_rank})

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.mse_loss(self.net(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class Recorder(RecordCallbackHooks, Callback):
    pass


def _csv_series(path: Path) -> dict[str, list[list[float]]]:
    """metrics.csv as {name: [[step, value], ...]} (the files' layouts differ; the content must not)."""
    series: dict[str, list[list[float]]] = {}
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            for name, cell in row.items():
                if name != "step" and cell != "":
                    series.setdefault(name, []).append([int(row["step"]), float(cell)])
    # Lightning writes a row per call, fullshard one per step: the same (step, value) pairs either way
    return {name: sorted({tuple(p): p for p in points}.values()) for name, points in sorted(series.items())}


def _tensorboard(run_dir: Path) -> dict[str, object]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    scalars = {t: [[e.step, e.value] for e in events.Scalars(t)] for t in sorted(events.Tags()["scalars"])}
    start = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    info = plugin_data_pb2.HParamsPluginData.FromString(start).session_start_info
    return {"scalars": scalars, "hparams_tab": sorted(info.hparams)}


def main(args):
    L.seed_everything(SEED)
    root = args.out / "work"
    mlflow_uri = f"sqlite:///{root / 'mlflow.db'}"
    loggers = [
        CSVLogger(root, name="csv"),
        TensorBoardLogger(root, name="tb", prefix="tb"),
        MLFlowLogger(
            experiment_name="porting", run_name="regressor", tracking_uri=mlflow_uri, tags={"k": "v"}
        ),
        WandbLogger(save_dir=root, offline=True, project="porting", name="regressor"),
    ]
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=args.strategy,
        max_epochs=2,
        log_every_n_steps=2,
        num_sanity_val_steps=0,
        callbacks=[Recorder(), ModelCheckpoint()],
        logger=loggers,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    model = Regressor()
    value("initial weights' sum", sum(float(p.sum()) for p in model.parameters()))
    mark("fit")
    trainer.fit(model, datamodule=Data())
    mark("after fit")
    value("log_dir", os.path.relpath(trainer.log_dir, root))
    value("checkpoint_dir", os.path.relpath(trainer.checkpoint_callback.dirpath, root))
    value("version_folders", sorted(str(p.relative_to(root)) for p in root.glob("*/version_*")))
    if trainer.global_rank != 0:
        return
    csv_logger, tb_logger, mlflow_logger, wandb_logger = loggers
    csv_dir, tb_dir = Path(csv_logger.log_dir), Path(tb_logger.log_dir)
    csv_hparams = (csv_dir / "hparams.yaml").read_text()
    value("csv hparams.yaml", csv_hparams)
    value("tensorboard hparams.yaml", (tb_dir / "hparams.yaml").read_text())
    series = _csv_series(csv_dir / "metrics.csv")
    value("csv metrics", series)
    board = _tensorboard(tb_dir)
    value("tensorboard", board)

    run_id = mlflow_logger.run_id
    wandb_logger.experiment.finish()
    ml = read_mlflow_run(mlflow_uri, run_id)
    value("mlflow", {k: ml[k] for k in ("status", "experiment", "params", "metrics")})
    value(
        "mlflow tags",
        {k: v for k, v in ml["tags"].items() if not k.startswith("mlflow.") or k == "mlflow.runName"},
    )
    wb = read_wandb_offline(root)
    value(
        "wandb",
        {"project": wb["project"], "name": wb["name"], "config": wb["config"], "history": wb["history"]},
    )

    expected = {"activation": "tanh", "batch_size": BATCH, "hidden": 6, "lr": 0.05, "samples": 32}
    check(
        "wandb's config holds the module's and datamodule's hyperparameters",
        wb["config"] == expected,
        wb["config"],
    )
    check(
        "mlflow's params are the same, as strings",
        ml["params"] == {k: str(v) for k, v in expected.items()},
        ml["params"],
    )
    check(
        "the first logger also holds rank 0's own call", "called_from_rank: 0\n" in csv_hparams, csv_hparams
    )
    ml_series = {
        name: sorted({(s, v): [s, v] for s, v in points}.values()) for name, points in ml["metrics"].items()
    }
    check(
        "mlflow holds the CSV's metric history",
        sorted(ml_series) == sorted(series)
        and all(close(ml_series[n], points) for n, points in series.items()),
        sorted(ml_series),
    )
    wandb_loss = [[h["trainer/global_step"], h["train_loss"]] for h in wb["history"] if "train_loss" in h]
    check(
        "wandb holds the CSV's train_loss at the same steps",
        [s for s, _ in wandb_loss] == [s for s, _ in series["train_loss"]]
        and close([v for _, v in wandb_loss], [v for _, v in series["train_loss"]]),
        wandb_loss,
    )
    tb_loss = board["scalars"]["tb-train_loss"]
    check(
        "tensorboard holds the CSV's train_loss under its prefix",
        [s for s, _ in tb_loss] == [s for s, _ in series["train_loss"]]
        and close([v for _, v in tb_loss], [v for _, v in series["train_loss"]], tol=1e-6),
        tb_loss,
    )


if __name__ == "__main__":
    run(main)
