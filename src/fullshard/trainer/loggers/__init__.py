"""Experiment loggers: where the Trainer sends logged metrics and hyperparameters.

One module per logger: the file-based ``CSVLogger`` and ``TensorBoardLogger`` (runs in
``save_dir/name/version_N``), and the trackers ``WandbLogger``, ``MLFlowLogger`` and
``CometLogger``, each needing its optional package (``pip install "fullshard[wandb]"``,
``[mlflow]``, ``[comet]``, ``[tensorboard]``), imported only when a logger is made. ``base``
holds the interface and the rank-zero rule ([Note: loggers on rank zero]); ``dispatch`` what the
Trainer calls.
"""

from fullshard.trainer.loggers.base import DummyExperiment, DummyLogger, Logger, rank_zero_experiment
from fullshard.trainer.loggers.comet import CometLogger
from fullshard.trainer.loggers.csv_logger import CSVLogger
from fullshard.trainer.loggers.dispatch import (
    checkpoint_root,
    finalize_loggers,
    log_run_start,
    run_dir,
    send_to_loggers,
)
from fullshard.trainer.loggers.mlflow import MLFlowLogger
from fullshard.trainer.loggers.tensorboard import TensorBoardLogger
from fullshard.trainer.loggers.wandb import WandbLogger

__all__ = [
    "CSVLogger",
    "CometLogger",
    "DummyExperiment",
    "DummyLogger",
    "Logger",
    "MLFlowLogger",
    "TensorBoardLogger",
    "WandbLogger",
    "checkpoint_root",
    "finalize_loggers",
    "log_run_start",
    "rank_zero_experiment",
    "run_dir",
    "send_to_loggers",
]
