"""Loggers under the names a Lightning script imports them by (``lightning.pytorch.loggers``)."""

from typing import TYPE_CHECKING

from fullshard.lightning_aliases import lightning_names
from fullshard.trainer.loggers.base import Logger
from fullshard.trainer.loggers.comet import CometLogger
from fullshard.trainer.loggers.csv_logger import CSVLogger
from fullshard.trainer.loggers.mlflow import MLFlowLogger
from fullshard.trainer.loggers.tensorboard import TensorBoardLogger
from fullshard.trainer.loggers.wandb import WandbLogger

__all__ = ["CSVLogger", "CometLogger", "Logger", "MLFlowLogger", "TensorBoardLogger", "WandbLogger"]

if not TYPE_CHECKING:  # Lightning's names that fullshard has not: [Note: Lightning's module paths]
    __getattr__ = lightning_names(__name__)
