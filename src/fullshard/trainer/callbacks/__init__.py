"""The Trainer's callbacks: the :class:`Callback` base class and the built-in ones (each in its
own module). Users import them from :mod:`fullshard.callbacks`."""

from fullshard.trainer.callbacks.base import Callback
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
from fullshard.trainer.callbacks.throughput import ThroughputMonitor, measure_flops
from fullshard.trainer.callbacks.timer import Timer
from fullshard.trainer.callbacks.weight_averaging import EMAWeightAveraging, WeightAveraging

__all__ = [
    "BackboneFinetuning",
    "BaseFinetuning",
    "BasePredictionWriter",
    "Callback",
    "DeviceStatsMonitor",
    "EMAWeightAveraging",
    "EarlyStopping",
    "EarlyStoppingReason",
    "GradientAccumulationScheduler",
    "LambdaCallback",
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
    "ThroughputMonitor",
    "Timer",
    "TrainingSpikeException",
    "WeightAveraging",
    "measure_flops",
]
