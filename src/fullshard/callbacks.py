"""Callbacks under the names a Lightning script imports them by (``lightning.pytorch.callbacks``)."""

from fullshard.trainer.callbacks.base import Callback
from fullshard.trainer.callbacks.early_stopping import EarlyStopping, EarlyStoppingReason
from fullshard.trainer.callbacks.lr_monitor import LearningRateMonitor
from fullshard.trainer.callbacks.model_checkpoint import ModelCheckpoint
from fullshard.trainer.callbacks.prediction_writer import BasePredictionWriter
from fullshard.trainer.callbacks.progress_bar import ProgressBar
from fullshard.trainer.callbacks.timer import Timer

TQDMProgressBar = ProgressBar
"""Lightning's name for the progress bar."""

__all__ = [
    "BasePredictionWriter",
    "Callback",
    "EarlyStopping",
    "EarlyStoppingReason",
    "LearningRateMonitor",
    "ModelCheckpoint",
    "ProgressBar",
    "TQDMProgressBar",
    "Timer",
]
