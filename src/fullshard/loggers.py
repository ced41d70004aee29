"""Loggers under the names a Lightning script imports them by (``lightning.pytorch.loggers``)."""

from fullshard.trainer.loggers import CSVLogger, Logger, TensorBoardLogger

__all__ = ["CSVLogger", "Logger", "TensorBoardLogger"]
