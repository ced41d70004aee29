"""The Trainer's read-only views (the running module, the stage, ranks, metrics, loggers,
checkpoint callbacks, loop progress); :class:`~fullshard.Trainer` inherits them, and its own
attributes they read are declared at the top of :class:`TrainerProperties`."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

from fullshard.trainer.callbacks.base import Callback
from fullshard.trainer.callbacks.early_stopping import EarlyStopping
from fullshard.trainer.callbacks.model_checkpoint import ModelCheckpoint
from fullshard.trainer.callbacks.progress_bar import ProgressBar
from fullshard.trainer.states import RunningStage, TrainerFn, TrainerState, TrainerStatus

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader

    from fullshard.datamodule import DataModule
    from fullshard.module import Module
    from fullshard.precision import Precision
    from fullshard.strategies import Strategy
    from fullshard.trainer.loggers.base import Logger
    from fullshard.trainer.loops import EvaluationLoop, FitLoop
    from fullshard.trainer.metrics import MetricsCollector
    from fullshard.trainer.preflight import DataSources


class TrainerProperties:
    """Views shared by every Trainer; the attributes below are the Trainer's own."""

    callbacks: list[Callback]
    loggers: list[Logger]
    limit_val_batches: int | float
    default_root_dir: str
    max_epochs: int
    fit_loop: FitLoop
    validate_loop: EvaluationLoop
    test_loop: EvaluationLoop
    predict_loop: EvaluationLoop
    # the Trainer's own state, which these views read
    _strategy: Strategy
    _accelerator: str
    _module: Module | None
    _datamodule: DataModule | None
    _data: DataSources | None
    _stage: str | None
    _metrics: MetricsCollector
    state: TrainerState

    @property
    def strategy(self) -> Strategy:
        """The strategy running this Trainer's processes."""
        return self._strategy

    @property
    def model(self) -> nn.Module | None:
        """The model as the strategy runs it (wrapped in DDP/FSDP once set up), as in Lightning;
        the user's module before that. :attr:`lightning_module` is always the user's module."""
        if self._strategy.model is not None:
            return self._strategy.model
        return self._module

    @property
    def lightning_module(self) -> Module:
        """The user's :class:`~fullshard.Module` (unwrapped)."""
        if self._module is None:
            raise RuntimeError(
                "Trainer.lightning_module is set once fit(), validate(), test() or predict() is called."
            )
        return self._module

    @property
    def datamodule(self) -> DataModule | None:
        """The DataModule of the current (or last) call, if one was given."""
        return self._datamodule

    @property
    def training(self) -> bool:
        """True while ``fit`` trains (from its ``setup`` on; not during its validation runs)."""
        return self.state.stage == RunningStage.TRAINING

    @property
    def validating(self) -> bool:
        """True while a validation run (in fit, or ``validate``) runs; not the sanity run."""
        return self.state.stage == RunningStage.VALIDATING

    @property
    def testing(self) -> bool:
        """True during ``test``."""
        return self.state.stage == RunningStage.TESTING

    @property
    def predicting(self) -> bool:
        """True during ``predict``."""
        return self.state.stage == RunningStage.PREDICTING

    @property
    def sanity_checking(self) -> bool:
        """True during the sanity validation before training."""
        return self.state.stage == RunningStage.SANITY_CHECKING

    @sanity_checking.setter
    def sanity_checking(self, value: bool) -> None:
        # the fit loop's switch: in and out of the sanity run, back to training
        if value:
            self.state.stage = RunningStage.SANITY_CHECKING
        elif self.sanity_checking:
            self.state.stage = RunningStage.TRAINING if self.state.fn == TrainerFn.FITTING else None

    @property
    def interrupted(self) -> bool:
        """Whether the last call raised (True from the callbacks' ``on_exception`` on, until the next call)."""
        return self.state.status == TrainerStatus.INTERRUPTED

    @property
    def estimated_stepping_batches(self) -> int | float:
        """The number of optimizer steps ``fit`` will take (as Lightning estimates it): usable in
        ``configure_optimizers``, e.g. for ``OneCycleLR(total_steps=...)``."""
        module, data = self._module, self._data
        if data is None or module is None or self._stage != "fit":
            return self.fit_loop.estimated_stepping_batches(None)
        return self.fit_loop.estimated_stepping_batches(lambda: data.get("train", module))

    @property
    def data_sources(self) -> DataSources | None:
        """Where the running (or last) call's dataloaders come from: the loaders given to it, a
        DataModule, or the module's ``*_dataloader()`` methods (the tuner rebuilds loaders from it)."""
        return self._data

    @property
    def progress_bar_callback(self) -> ProgressBar | None:
        """The progress bar among :attr:`callbacks` (``TQDMProgressBar``/``RichProgressBar``), or None."""
        return next((cb for cb in self.callbacks if isinstance(cb, ProgressBar)), None)

    @property
    def metrics_collector(self) -> MetricsCollector:
        """What ``Module.log`` records into and the loops reduce; users read
        :attr:`callback_metrics`, :attr:`logged_metrics` and :attr:`progress_bar_metrics`."""
        return self._metrics

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on global rank 0 only."""
        if self.is_global_zero:
            print(*args, **kwargs)

    @property
    def precision(self) -> str:
        """The precision setting, spelled as in :data:`fullshard.precision.PRECISIONS`
        (``"bf16-mixed"`` for ``precision="bf16"``), as in Lightning."""
        return self.strategy.precision.precision

    @property
    def global_rank(self) -> int:
        """Rank of this process among all processes of the job."""
        return self.strategy.global_rank

    @property
    def local_rank(self) -> int:
        """Rank of this process on its node."""
        return self.strategy.local_rank

    @property
    def node_rank(self) -> int:
        """Rank of this process's node."""
        return self.strategy.node_rank

    @property
    def world_size(self) -> int:
        """Number of processes in the job."""
        return self.strategy.world_size

    @property
    def num_devices(self) -> int:
        """Devices (processes) per node."""
        return len(self.strategy.devices)

    @property
    def is_global_zero(self) -> bool:
        """True in the process with global rank 0."""
        return self.strategy.is_global_zero

    @property
    def callback_metrics(self) -> dict[str, torch.Tensor]:
        """The latest value of every logged metric."""
        return self.metrics_collector.callback_metrics

    @property
    def logged_metrics(self) -> dict[str, torch.Tensor]:
        """The latest value of every metric sent to the loggers."""
        return self.metrics_collector.logged_metrics

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        """The latest values of the metrics logged with ``prog_bar=True``."""
        return self.metrics_collector.progress_bar_metrics()

    @property
    def logger(self) -> Logger | None:
        """The first logger, if any."""
        return self.loggers[0] if self.loggers else None

    @property
    def log_dir(self) -> str:
        """The first logger's directory (its ``save_dir`` for W&B, MLflow, Comet), else ``default_root_dir``."""
        from fullshard.trainer.loggers.dispatch import run_dir

        return run_dir(self.loggers, self.default_root_dir)

    @property
    def checkpoint_callback(self) -> ModelCheckpoint | None:
        """The first :class:`ModelCheckpoint` among the callbacks."""
        return next((cb for cb in self.callbacks if isinstance(cb, ModelCheckpoint)), None)

    @property
    def checkpoint_callbacks(self) -> list[ModelCheckpoint]:
        """Every :class:`ModelCheckpoint` among the callbacks."""
        return [cb for cb in self.callbacks if isinstance(cb, ModelCheckpoint)]

    @property
    def max_epochs_reached(self) -> bool:
        """Whether training stopped because ``max_epochs`` was reached."""
        return self.max_epochs >= 0 and self.current_epoch >= self.max_epochs

    @property
    def logger_step(self) -> int:
        """The step number loggers get now.

        [Note: logger steps]
        Lightning logs step metrics at the number of optimizer steps taken *before* the current
        one (the first step logs at 0), and epoch-end training metrics at that of the epoch's
        last step; validation in the middle of training logs at the count so far. fullshard uses
        the same numbers, so curves of a ported script line up with its Lightning ones.
        """
        return self.fit_loop.progress.batches_that_stepped

    @property
    def current_epoch(self) -> int:
        """The epoch training is in (epochs finished so far)."""
        return self.fit_loop.progress.epoch

    @current_epoch.setter
    def current_epoch(self, epoch: int) -> None:
        self.fit_loop.progress.epoch = epoch

    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far."""
        return self.fit_loop.progress.global_step

    @global_step.setter
    def global_step(self, step: int) -> None:
        self.fit_loop.progress.global_step = step

    @property
    def num_training_batches(self) -> int | float:
        """Training batches per epoch (inf for a loader without a length)."""
        return self.fit_loop.num_training_batches

    @property
    def num_val_batches(self) -> list[int | float]:
        """Validation batches per run, one entry per dataloader (Lightning's form); kept after the call."""
        return self.validate_loop.batches_per_loader

    @property
    def num_sanity_val_batches(self) -> list[int | float]:
        """Batches of the sanity validation before training, one entry per dataloader."""
        return self.validate_loop.sanity_batches_per_loader

    @property
    def num_test_batches(self) -> list[int | float]:
        """Test batches per run, one entry per dataloader; kept after the call."""
        return self.test_loop.batches_per_loader

    @property
    def num_predict_batches(self) -> list[int | float]:
        """Prediction batches per run, one entry per dataloader; kept after the call."""
        return self.predict_loop.batches_per_loader

    # ------------------------------------------------------------ Lightning's other views
    @property
    def train_dataloader(self) -> DataLoader[Any] | None:
        """The training dataloader of the running (or last) ``fit``, as the loop iterates it
        (with its distributed sampler); None before one was built."""
        loader = self.fit_loop.train_loader
        return None if loader is None else loader.loader

    @property
    def val_dataloaders(self) -> DataLoader[Any] | list[DataLoader[Any]] | None:
        """The validation dataloader of ``fit``/``validate`` (a list when there are several); None before."""
        return _loaders(self.validate_loop)

    @property
    def test_dataloaders(self) -> DataLoader[Any] | list[DataLoader[Any]] | None:
        """The test dataloader of ``test`` (a list when there are several); None before."""
        return _loaders(self.test_loop)

    @property
    def predict_dataloaders(self) -> DataLoader[Any] | list[DataLoader[Any]] | None:
        """The prediction dataloader of ``predict`` (a list when there are several); None before."""
        return _loaders(self.predict_loop)

    @property
    def precision_plugin(self) -> Precision:
        """The strategy's :class:`~fullshard.precision.Precision` (Lightning's precision plugin)."""
        return self._strategy.precision_plugin

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        """The gradient scaler of ``"16-mixed"``; None otherwise."""
        return self._strategy.precision.scaler

    @property
    def accelerator(self) -> str:
        """The accelerator's name: ``"cpu"`` or ``"cuda"`` (Lightning: an ``Accelerator`` object)."""
        return self._accelerator

    @property
    def num_nodes(self) -> int:
        """Machines the job runs on."""
        return self._strategy.num_nodes

    @property
    def device_ids(self) -> list[int]:
        """The index of each device of this node (0 for the CPU)."""
        return [device.index or 0 for device in self._strategy.devices]

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int] | None:
        """``num_replicas`` and ``rank`` of the distributed sampler (None with one process)."""
        return self._strategy.distributed_sampler_kwargs if self._strategy.world_size > 1 else None

    @property
    def early_stopping_callback(self) -> EarlyStopping | None:
        """The first :class:`EarlyStopping` among the callbacks."""
        return next(iter(self.early_stopping_callbacks), None)

    @property
    def early_stopping_callbacks(self) -> list[EarlyStopping]:
        """Every :class:`EarlyStopping` among the callbacks."""
        return [cb for cb in self.callbacks if isinstance(cb, EarlyStopping)]

    @property
    def received_sigterm(self) -> bool:
        """Whether this process received SIGTERM during ``fit`` (one of ``preemption_signals``:
        the run then stops at an agreed step, saves and ends with ``TrainingPreempted``)."""
        preempt = self.fit_loop.preemption
        return preempt.requested and preempt.signum == signal.SIGTERM

    @property
    def evaluating(self) -> bool:
        """Whether a validation or test run is going on (the sanity run and ``fit``'s validation included)."""
        return self.state.stage is not None and self.state.stage.evaluating

    @property
    def enable_validation(self) -> bool:
        """Whether the running ``fit`` validates: it has validation data, a ``validation_step`` and
        ``limit_val_batches`` above 0."""
        module = self._module
        if module is None or self._data is None or not self.limit_val_batches:
            return False
        from fullshard.module import Module
        from fullshard.trainer.preflight import overrides

        return self._data.has("val", module) and overrides(module, Module, "validation_step")


def _loaders(loop: EvaluationLoop) -> DataLoader[Any] | list[DataLoader[Any]] | None:
    loaders = [prepared.loader for prepared in loop.loaders]
    if not loaders:
        return None
    return loaders[0] if len(loaders) == 1 else loaders
