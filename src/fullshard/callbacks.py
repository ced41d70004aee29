"""Callbacks under the names a Lightning script imports them by (``lightning.pytorch.callbacks``)."""

from fullshard.trainer.callbacks import Callback
from fullshard.trainer.early_stopping import EarlyStopping, EarlyStoppingReason
from fullshard.trainer.lr_monitor import LearningRateMonitor
from fullshard.trainer.model_checkpoint import ModelCheckpoint
from fullshard.trainer.progress import ProgressBar

TQDMProgressBar = ProgressBar
"""Lightning's name for the progress bar."""

__all__ = ["Callback", "EarlyStopping", "EarlyStoppingReason", "LearningRateMonitor", "ModelCheckpoint", "ProgressBar", "TQDMProgressBar"]
