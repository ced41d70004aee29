"""Loggers under the names a Lightning script imports them by (``lightning.pytorch.loggers``)."""

from typing import TYPE_CHECKING

from fullshard.lightning_aliases import lightning_names
from fullshard.trainer.loggers import (
    CometLogger,
    CSVLogger,
    Logger,
    MLFlowLogger,
    TensorBoardLogger,
    WandbLogger,
)

__all__ = ["CSVLogger", "CometLogger", "Logger", "MLFlowLogger", "TensorBoardLogger", "WandbLogger"]

if not TYPE_CHECKING:  # Lightning's names that fullshard has not: [Note: Lightning's module paths]
    __getattr__ = lightning_names(__name__)
