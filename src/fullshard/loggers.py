"""Loggers under the names a Lightning script imports them by (``lightning.pytorch.loggers``)."""

from fullshard.trainer.loggers import (
    CometLogger,
    CSVLogger,
    Logger,
    MLFlowLogger,
    TensorBoardLogger,
    WandbLogger,
)

__all__ = ["CSVLogger", "CometLogger", "Logger", "MLFlowLogger", "TensorBoardLogger", "WandbLogger"]
