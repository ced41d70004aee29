"""Callbacks under the names a Lightning script imports them by (``lightning.pytorch.callbacks``)."""

from fullshard.trainer.callbacks.base import Callback, Checkpoint
from fullshard.trainer.callbacks.device_stats import DeviceStatsMonitor
from fullshard.trainer.callbacks.early_stopping import EarlyStopping, EarlyStoppingReason
from fullshard.trainer.callbacks.finetuning import BackboneFinetuning, BaseFinetuning
from fullshard.trainer.callbacks.gradient_accumulation import GradientAccumulationScheduler
from fullshard.trainer.callbacks.lambda_function import LambdaCallback
from fullshard.trainer.callbacks.lr_monitor import LearningRateMonitor
from fullshard.trainer.callbacks.model_checkpoint import ModelCheckpoint
from fullshard.trainer.callbacks.model_summary import ModelSummary, RichModelSummary
from fullshard.trainer.callbacks.on_exception_checkpoint import OnExceptionCheckpoint
from fullshard.trainer.callbacks.prediction_writer import BasePredictionWriter
from fullshard.trainer.callbacks.progress_bar import ProgressBar, TQDMProgressBar
from fullshard.trainer.callbacks.pruning import ModelPruning
from fullshard.trainer.callbacks.rich_progress import RichProgressBar, RichProgressBarTheme
from fullshard.trainer.callbacks.spike import SpikeDetection, TrainingSpikeException
from fullshard.trainer.callbacks.stochastic_weight_avg import StochasticWeightAveraging
from fullshard.trainer.callbacks.throughput import Throughput, ThroughputMonitor
from fullshard.trainer.callbacks.timer import Timer
from fullshard.trainer.callbacks.weight_averaging import EMAWeightAveraging, WeightAveraging
from fullshard.tuner.callbacks.batch_size_finder import BatchSizeFinder
from fullshard.tuner.callbacks.lr_finder import LearningRateFinder

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
]
