"""Callbacks under the names a Lightning script imports them by (``lightning.pytorch.callbacks``)."""

from fullshard.trainer.callbacks import (
    BackboneFinetuning,
    BaseFinetuning,
    DeviceStatsMonitor,
    EMAWeightAveraging,
    GradientAccumulationScheduler,
    LambdaCallback,
    ModelPruning,
    ModelSummary,
    OnExceptionCheckpoint,
    RichModelSummary,
    RichProgressBar,
    SpikeDetection,
    StochasticWeightAveraging,
    ThroughputMonitor,
    WeightAveraging,
)
from fullshard.trainer.callbacks.base import Callback, Checkpoint
from fullshard.trainer.callbacks.early_stopping import EarlyStopping, EarlyStoppingReason
from fullshard.trainer.callbacks.lr_monitor import LearningRateMonitor
from fullshard.trainer.callbacks.model_checkpoint import ModelCheckpoint
from fullshard.trainer.callbacks.prediction_writer import BasePredictionWriter
from fullshard.trainer.callbacks.progress_bar import ProgressBar, TQDMProgressBar
from fullshard.trainer.callbacks.rich_progress import RichProgressBarTheme
from fullshard.trainer.callbacks.spike import TrainingSpikeException
from fullshard.trainer.callbacks.throughput import Throughput, measure_flops
from fullshard.trainer.callbacks.timer import Timer
from fullshard.tuner.callbacks import BatchSizeFinder, LearningRateFinder

__all__ = [
    "BackboneFinetuning",
    "BaseFinetuning",
    "BasePredictionWriter",
    "BatchSizeFinder",
    "Callback",
    "Checkpoint",
    "DeviceStatsMonitor",
    "EMAWeightAveraging",
    "EarlyStopping",
    "EarlyStoppingReason",
    "GradientAccumulationScheduler",
    "LambdaCallback",
    "LearningRateFinder",
    "LearningRateMonitor",
    "ModelCheckpoint",
    "ModelPruning",
    "ModelSummary",
    "OnExceptionCheckpoint",
    "ProgressBar",
    "RichModelSummary",
    "RichProgressBar",
    "RichProgressBarTheme",
    "SpikeDetection",
    "StochasticWeightAveraging",
    "TQDMProgressBar",
    "Throughput",
    "ThroughputMonitor",
    "Timer",
    "TrainingSpikeException",
    "WeightAveraging",
    "measure_flops",
]
