"""The Trainer: the host that drives a Strategy through fit, validate, test and predict."""

from __future__ import annotations

import functools
import logging
import math
import os
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from lightning_utilities.core.rank_zero import rank_zero_info, rank_zero_only, rank_zero_warn
from torch import nn
from torch.optim import Optimizer

from fullshard.compile import parse_compile
from fullshard.datamodule import DataModule
from fullshard.errors import CheckpointError, MisconfigurationError
from fullshard.launch import SpawnLauncher, select_cluster_environment
from fullshard.module import Module
from fullshard.precision import alias_warning
from fullshard.seed import current_seed
from fullshard.strategies import STRATEGY_REGISTRY, DDPStrategy, SingleDeviceStrategy, Strategy
from fullshard.strategies.meta_init import init_new_modules, user_init_of
from fullshard.trainer import arguments, checkpointing, evaluation, loops, nonfinite, preemption
from fullshard.trainer.callbacks import Callback
from fullshard.trainer.data import PreparedLoader, SavedPosition
from fullshard.trainer.data_setup import DataSetup
from fullshard.trainer.devices import (
    more_processes_than_cores,
    resolve_accelerator,
    resolve_devices,
    resolve_num_nodes,
)
from fullshard.trainer.loggers import CSVLogger, Logger
from fullshard.trainer.metrics import MetricsCollector
from fullshard.trainer.model_checkpoint import ModelCheckpoint
from fullshard.trainer.optimizers import LRSchedulerConfig, parse_optimizers
from fullshard.trainer.preflight import DataSources, check_lightning_only_hooks, overrides, single_loader
from fullshard.trainer.progress import ProgressBar
from fullshard.trainer.summary import format_results, model_summary

log = logging.getLogger("fullshard")

_HOOKS = [name for name in vars(Callback) if name.startswith("on_") or name in ("setup", "teardown")]
_CALLBACK_ONLY = frozenset({"on_sanity_check_start", "on_sanity_check_end", "on_exception"})


def _monitoring_types() -> tuple[type, ...]:
    """Callbacks that act on metrics an epoch-end hook of the module may log."""
    from fullshard.trainer.early_stopping import EarlyStopping

    return (ModelCheckpoint, EarlyStopping)


class Trainer(DataSetup):
    """Runs training, validation, test and prediction of a :class:`fullshard.Module` with a strategy.

    The arguments are Lightning 2.x's, with its defaults (docs/lightning.md lists what differs).

    Args:
        accelerator: ``"auto"``, ``"cpu"`` or ``"cuda"`` (``"gpu"`` is an alias).
        strategy: ``"auto"``, a registered name (``"ddp"``, ``"fsdp"``, ...) or a
            :class:`~fullshard.strategies.Strategy` instance.
        devices: processes per node: ``"auto"``, an int, -1 (all GPUs) or a list of GPU indices.
        num_nodes: number of machines, or ``"auto"``: as many as torchrun (``GROUP_WORLD_SIZE``) or
            SLURM (``SLURM_NNODES``) started, 1 otherwise; for elastic jobs whose node count varies.
        precision: ``"32-true"``, ``"16-mixed"``, ``"bf16-mixed"``, ``"16-true"`` or ``"bf16-true"``;
            Lightning's aliases ``32``/``"32"``, ``16``/``"16"`` and ``"bf16"`` mean the same settings
            (:attr:`precision` gives the canonical name).
        logger: a :class:`~fullshard.loggers.Logger`, a list of them, True/None for a
            :class:`~fullshard.loggers.CSVLogger` in ``default_root_dir``, or False.
        callbacks: extra :class:`~fullshard.Callback` instances.
        fast_dev_run: run this many batches (True: 1) of each stage, with no logging,
            checkpointing or sanity run, to find bugs fast.
        max_epochs: stop after this many epochs (default 1000 when ``max_steps`` is not set; -1: no limit).
        min_epochs: do not stop early (``EarlyStopping``, ``should_stop``) before this many epochs.
        max_steps: stop after this many optimizer steps (-1: no limit).
        min_steps: do not stop early before this many optimizer steps.
        limit_train_batches, limit_val_batches, limit_test_batches, limit_predict_batches:
            batches per epoch of each stage: a fraction (float) or a count (int).
        val_check_interval: validate every this fraction of an epoch (float) or number of
            training batches (int).
        check_val_every_n_epoch: validate in every n-th epoch; None with an int
            ``val_check_interval`` counts batches across epochs.
        num_sanity_val_steps: validation batches run before training to catch bugs (-1: all).
        log_every_n_steps: send step metrics to the loggers every this many optimizer steps.
        enable_checkpointing: add a :class:`~fullshard.ModelCheckpoint` when none is given.
        enable_progress_bar: show a progress bar on global rank 0.
        enable_model_summary: log a summary of the model's layers and parameters when fit starts.
        accumulate_grad_batches: micro-batches per optimizer step.
        gradient_clip_val: clip gradients to this norm (or value, see ``gradient_clip_algorithm``).
        gradient_clip_algorithm: ``"norm"`` (default) or ``"value"``.
        deterministic: ``torch.use_deterministic_algorithms`` (True, or ``"warn"`` to warn only).
        benchmark: ``torch.backends.cudnn.benchmark`` (None leaves it as it is).
        inference_mode: accepted for Lightning compatibility; evaluation runs under
            ``torch.no_grad`` (inference tensors cannot be used by FSDP afterwards).
        use_distributed_sampler: rebuild map-style loaders around a distributed, resumable
            sampler (see docs/getting-started.md); False uses the loaders as given.
        detect_anomaly: run with ``torch.autograd.detect_anomaly``.
        default_root_dir: where logs and checkpoints go by default (current directory).
        compile: ``torch.compile`` the model in each process once the strategy set it up: True,
            False/None, or a dict of ``torch.compile`` keyword arguments. Under FSDP each unit
            (e.g. transformer block) is compiled, otherwise the module's ``forward``; the step
            methods stay eager. Not a Lightning option (there, call ``torch.compile(model)``);
            see docs/compile.md. A strategy's own ``compile=`` must agree with it.
        preemption_signals: signals that stop training cleanly (docs/clusters.md): every rank
            agrees on an optimizer step, saves ``last.ckpt`` (in the ModelCheckpoint's directory,
            else ``default_root_dir``) and leaves ``fit`` with ``TrainingPreempted``, exit status
            128 + the signal's number. Names, numbers or ``signal.Signals``; None turns it off.
            Not a Lightning option (Lightning handles SIGTERM in its SLURM plugin).
        requeue_on_preemption: under SLURM, rank 0 runs ``scontrol requeue $SLURM_JOB_ID`` after
            the preemption checkpoint is saved.
        on_nonfinite_loss: when a training loss is NaN or infinite on any rank: ``"raise"`` stops
            before that optimizer step with ``NonFiniteLossError`` naming the step and ranks;
            ``"skip"`` skips that optimizer step on every rank; None does not check (it warns
            once, on rank 0, when it sees one). Not a Lightning option; see docs/checkpoints.md
            for its cost.
    """

    def __init__(
        self,
        *,
        accelerator: str = "auto",
        strategy: str | Strategy = "auto",
        devices: Any = "auto",
        num_nodes: int | str = 1,
        precision: Any = "32-true",
        logger: Logger | Iterable[Logger] | bool | None = None,
        callbacks: Callback | Iterable[Callback] | None = None,
        fast_dev_run: int | bool = False,
        max_epochs: int | None = None,
        min_epochs: int | None = None,
        max_steps: int = -1,
        min_steps: int | None = None,
        limit_train_batches: int | float | None = None,
        limit_val_batches: int | float | None = None,
        limit_test_batches: int | float | None = None,
        limit_predict_batches: int | float | None = None,
        val_check_interval: int | float | None = None,
        check_val_every_n_epoch: int | None = 1,
        num_sanity_val_steps: int | None = None,
        log_every_n_steps: int | None = None,
        enable_checkpointing: bool | None = None,
        enable_progress_bar: bool | None = None,
        enable_model_summary: bool | None = None,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: int | float | None = None,
        gradient_clip_algorithm: str | None = None,
        deterministic: bool | str | None = None,
        benchmark: bool | None = None,
        inference_mode: bool = True,
        use_distributed_sampler: bool = True,
        detect_anomaly: bool = False,
        default_root_dir: str | Path | None = None,
        compile: bool | dict[str, Any] | None = None,
        preemption_signals: Any = preemption.DEFAULT_SIGNALS,
        requeue_on_preemption: bool = True,
        on_nonfinite_loss: str | None = "raise",
        **lightning_only: Any,
    ) -> None:
        arguments.reject_unknown(lightning_only)
        self.fast_dev_run = arguments.fast_dev_run_batches(fast_dev_run)
        log_every_n_steps = 50 if log_every_n_steps is None else log_every_n_steps
        arguments.check_counts(
            accumulate_grad_batches=accumulate_grad_batches,
            log_every_n_steps=log_every_n_steps,
        )
        if max_steps != -1 and (isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 0):
            raise MisconfigurationError(
                f"max_steps={max_steps!r} is invalid: use -1 (no limit) or an int >= 0."
            )
        if max_epochs is not None and (not isinstance(max_epochs, int) or max_epochs < -1):
            raise MisconfigurationError(
                f"max_epochs={max_epochs!r} is invalid: use -1 (no limit) or an int >= 0."
            )
        arguments.check_optional_count("min_epochs", min_epochs, 0)
        arguments.check_optional_count("min_steps", min_steps, 0)
        arguments.check_optional_count("check_val_every_n_epoch", check_val_every_n_epoch, 1)
        if num_sanity_val_steps is not None and (
            isinstance(num_sanity_val_steps, bool)
            or not isinstance(num_sanity_val_steps, int)
            or num_sanity_val_steps < -1
        ):
            raise MisconfigurationError(
                f"num_sanity_val_steps={num_sanity_val_steps!r} is invalid: use an int >= 0, or -1 for the "
                "whole validation set."
            )
        gradient_clip_algorithm = gradient_clip_algorithm or "norm"
        arguments.check_clipping(gradient_clip_val, gradient_clip_algorithm)
        val_check_interval = 1.0 if val_check_interval is None else val_check_interval
        arguments.check_val_check_interval(val_check_interval)
        if isinstance(val_check_interval, float) and check_val_every_n_epoch is None:
            raise MisconfigurationError(
                f"val_check_interval={val_check_interval} (a fraction of an epoch) needs "
                "check_val_every_n_epoch to be set; with check_val_every_n_epoch=None pass a number of "
                "batches (int)."
            )
        given_limits = {
            "limit_train_batches": limit_train_batches,
            "limit_val_batches": limit_val_batches,
            "limit_test_batches": limit_test_batches,
            "limit_predict_batches": limit_predict_batches,
        }
        limits: dict[str, int | float] = {k: (1.0 if v is None else v) for k, v in given_limits.items()}
        arguments.check_limits(**limits)
        arguments.check_deterministic(deterministic)
        compile_config = parse_compile(compile, "Trainer")
        self._preemption_signals = preemption.parse_signals(preemption_signals)
        if not isinstance(requeue_on_preemption, bool):
            raise MisconfigurationError(f"requeue_on_preemption={requeue_on_preemption!r} must be True or False.")
        self._requeue_on_preemption = requeue_on_preemption
        self._nonfinite = nonfinite.parse(on_nonfinite_loss)  # [Note: agreeing on a non-finite loss]
        # what the loop reads at each optimizer step; a live one is set for each fit
        self._preemption = preemption.Preemption((), requeue=False)

        if self.fast_dev_run:
            limits = dict.fromkeys(limits, self.fast_dev_run)
            max_steps, max_epochs, num_sanity_val_steps = self.fast_dev_run, 1, 0
            val_check_interval, check_val_every_n_epoch = 1.0, 1
            logger = False
        self.limit_train_batches = limits["limit_train_batches"]
        self.limit_val_batches = limits["limit_val_batches"]
        self.limit_test_batches = limits["limit_test_batches"]
        self.limit_predict_batches = limits["limit_predict_batches"]
        self.max_steps = max_steps
        self.max_epochs = max_epochs if max_epochs is not None else (1000 if max_steps == -1 else -1)
        self.min_epochs = min_epochs
        self.min_steps = min_steps
        self.val_check_interval = val_check_interval
        self.check_val_every_n_epoch = check_val_every_n_epoch
        self.num_sanity_val_steps = 2 if num_sanity_val_steps is None else num_sanity_val_steps
        self.accumulate_grad_batches = accumulate_grad_batches
        self.gradient_clip_val = gradient_clip_val or None
        self.gradient_clip_algorithm = gradient_clip_algorithm
        self.log_every_n_steps = log_every_n_steps
        self.deterministic = deterministic
        self.benchmark = benchmark
        self.inference_mode = inference_mode
        self.use_distributed_sampler = use_distributed_sampler
        self.detect_anomaly = detect_anomaly
        self.enable_model_summary = enable_model_summary is not False
        self.default_root_dir = str(default_root_dir) if default_root_dir is not None else os.getcwd()

        self._accelerator = resolve_accelerator(accelerator)
        environment = select_cluster_environment()
        num_nodes = resolve_num_nodes(num_nodes, environment)
        device_list = resolve_devices(devices, self._accelerator, environment, num_nodes)
        self._strategy = self._resolve_strategy(strategy, len(device_list) * num_nodes)
        self._strategy.configure(
            devices=device_list,
            num_nodes=num_nodes,
            cluster_environment=environment,
            precision=precision,
            compile=compile_config,
        )
        rank_zero_only.rank = self.global_rank  # type: ignore[attr-defined]  # warnings before fit: rank 0 only
        if (note := alias_warning(precision)) is not None:
            rank_zero_warn(note, stacklevel=5)
        if (
            self._accelerator == "cpu"
            and self._strategy.launcher is not None
            and not environment.creates_processes_externally  # this process starts the others
            and (note := more_processes_than_cores(len(device_list))) is not None
        ):
            rank_zero_warn(note, stacklevel=5)

        self.callbacks = self._build_callbacks(
            callbacks, enable_checkpointing is not False, enable_progress_bar is not False
        )
        self.loggers = self._build_loggers(logger)

        self.current_epoch = 0
        self.global_step = 0
        self.should_stop = False
        self.sanity_checking = False
        self.is_last_batch = False
        self.batch_idx_start = 0
        self.num_training_batches: int | float = 0
        self._val_batches: int | float = 0  # per epoch of each stage; Lightning's lists are properties
        self._test_batches: int | float = 0
        self._predict_batches: int | float = 0
        self.optimizers: list[Optimizer] = []
        self.lr_scheduler_configs: list[LRSchedulerConfig] = []
        self._batches_in_epoch = 0
        self._batches_that_stepped = 0  # Lightning's step for loggers, see [Note: logger steps]
        self._total_batch_idx = 0
        self._epoch_finished = False
        self._resume_point: tuple[int, int, int | None] | None = None  # see [Note: epochs cut short]
        self._epoch_start = (0, 0)  # (batch index, samples consumed) where this run of the epoch began
        self._saved_position: SavedPosition | None = None  # from a checkpoint, until the loader exists
        self._pending_loop_state: dict[str, Any] | None = None  # from a checkpoint, until the loop starts
        self._data_seed: int | None = None  # from a checkpoint, until the training loader exists
        self._epoch_end_pending = False
        self.ckpt_path: str | None = None  # the checkpoint the current call loaded, if any
        self._resolved_ckpt_path: str | None = None
        self._stage: str | None = None
        self._module: Module | None = None
        self._datamodule: DataModule | None = None
        self._train_loader: PreparedLoader | None = None
        self._val_loader: PreparedLoader | None = None
        self._test_loader: PreparedLoader | None = None
        self._predict_loader: PreparedLoader | None = None
        self._raw_train_loader: Any = None  # only while checking configure_optimizers before launch
        self._data: DataSources | None = None  # where the current call's loaders come from
        self._val_check_batch: int | float = 0
        self._metrics = MetricsCollector(self._strategy.all_reduce)
        self._hooks: dict[str, list[Callable[..., Any]]] = {}
        self._spawn_state: dict[str, torch.Tensor] = {}

    # ------------------------------------------------------------------------ construction
    @staticmethod
    def _resolve_strategy(strategy: str | Strategy, world_size: int) -> Strategy:
        if isinstance(strategy, Strategy):
            resolved = strategy
        elif isinstance(strategy, str):
            if strategy == "auto":
                return SingleDeviceStrategy() if world_size == 1 else DDPStrategy()
            resolved = STRATEGY_REGISTRY.get(strategy)
        else:
            raise MisconfigurationError(
                f"strategy must be a name or a fullshard.strategies.Strategy instance, got {type(strategy).__name__}. "
                f"Registered names: {', '.join(STRATEGY_REGISTRY.available())}."
            )
        if isinstance(resolved, SingleDeviceStrategy) and world_size > 1:
            raise MisconfigurationError(
                f"strategy='single_device' runs one process, but {world_size} devices were requested. Use "
                "devices=1, or a multi-process strategy such as strategy='ddp'."
            )
        return resolved

    def _build_callbacks(
        self, callbacks: Callback | Iterable[Callback] | None, checkpointing: bool, progress_bar: bool
    ) -> list[Callback]:
        given = [callbacks] if isinstance(callbacks, Callback) else list(callbacks or [])
        for cb in given:
            if not isinstance(cb, Callback):
                raise MisconfigurationError(
                    f"callbacks must be fullshard Callback instances, got {type(cb).__name__}. Subclass "
                    "fullshard.Callback (a Lightning callback ports by changing its import)."
                )
        if checkpointing and not any(isinstance(cb, ModelCheckpoint) for cb in given):
            given.append(ModelCheckpoint())
        if progress_bar and not any(isinstance(cb, ProgressBar) for cb in given):
            given.insert(0, ProgressBar())
        # As in Lightning, checkpointing callbacks act last, after every other callback.
        return [cb for cb in given if not isinstance(cb, ModelCheckpoint)] + [
            cb for cb in given if isinstance(cb, ModelCheckpoint)
        ]

    def _build_loggers(self, logger: Logger | Iterable[Logger] | bool | None) -> list[Logger]:
        if logger is None or logger is True:
            return [CSVLogger(self.default_root_dir)]
        if logger is False:
            return []
        loggers = [logger] if isinstance(logger, Logger) else list(logger)  # type: ignore[arg-type]
        for lg in loggers:
            if not isinstance(lg, Logger):
                raise MisconfigurationError(
                    f"logger must be a fullshard Logger (CSVLogger, TensorBoardLogger), a list of them, or a "
                    f"bool; got {type(lg).__name__}."
                )
        return loggers

    # -------------------------------------------------------------------------- properties
    @property
    def strategy(self) -> Strategy:
        """The strategy running this Trainer's processes."""
        return self._strategy

    @property
    def precision(self) -> str:
        """The precision setting, spelled as in :data:`fullshard.precision.PRECISIONS`
        (``"bf16-mixed"`` for ``precision="bf16"``), as in Lightning."""
        return self._strategy.precision.precision

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
    def global_rank(self) -> int:
        """Rank of this process among all processes of the job."""
        return self._strategy.global_rank

    @property
    def local_rank(self) -> int:
        """Rank of this process on its node."""
        return self._strategy.local_rank

    @property
    def node_rank(self) -> int:
        """Rank of this process's node."""
        return self._strategy.node_rank

    @property
    def world_size(self) -> int:
        """Number of processes in the job."""
        return self._strategy.world_size

    @property
    def num_devices(self) -> int:
        """Devices (processes) per node."""
        return len(self._strategy.devices)

    @property
    def is_global_zero(self) -> bool:
        """True in the process with global rank 0."""
        return self._strategy.is_global_zero

    @property
    def training(self) -> bool:
        """True while the training loop runs (not during its validation)."""
        return self._stage == "fit" and self._metrics.stage == "train"

    @property
    def validating(self) -> bool:
        """True while a validation run (in fit, or ``validate``) runs."""
        return self._stage in ("fit", "validate") and self._metrics.stage == "validate"

    @property
    def testing(self) -> bool:
        """True during ``test``."""
        return self._stage == "test"

    @property
    def predicting(self) -> bool:
        """True during ``predict``."""
        return self._stage == "predict"

    @property
    def callback_metrics(self) -> dict[str, torch.Tensor]:
        """The latest value of every logged metric."""
        return self._metrics.callback_metrics

    @property
    def logged_metrics(self) -> dict[str, torch.Tensor]:
        """The latest value of every metric sent to the loggers."""
        return self._metrics.logged_metrics

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        """The latest values of the metrics logged with ``prog_bar=True``."""
        return self._metrics.progress_bar_metrics()

    @property
    def logger(self) -> Logger | None:
        """The first logger, if any."""
        return self.loggers[0] if self.loggers else None

    @property
    def log_dir(self) -> str:
        """The first logger's directory, else ``default_root_dir``."""
        return self.loggers[0].log_dir if self.loggers else self.default_root_dir

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
    def estimated_stepping_batches(self) -> int | float:
        """The number of optimizer steps ``fit`` will take (as Lightning estimates it): usable in
        ``configure_optimizers``, e.g. for ``OneCycleLR(total_steps=...)``."""
        if self.max_epochs == -1:
            return math.inf if self.max_steps == -1 else self.max_steps
        if self._train_loader is None:
            if self._raw_train_loader is not None:  # before any process starts (preflight)
                self._setup_train_loader(self._raw_train_loader)
            elif self._data is not None and self._module is not None and self._stage == "fit":
                rank_zero_info("Building the training dataloader to estimate the number of stepping batches.")
                self._setup_train_loader(self._data.get("train", self._module))
            else:
                raise RuntimeError(
                    "estimated_stepping_batches needs the training dataloader: read it inside fit() "
                    "(e.g. in configure_optimizers)."
                )
        total = self.num_training_batches
        if math.isinf(total):
            return self.max_steps if self.max_steps != -1 else math.inf
        steps = math.ceil(total / self.accumulate_grad_batches) * max(self.max_epochs, 1)
        return min(steps, self.max_steps) if self.max_steps != -1 else steps

    @property
    def _logger_step(self) -> int:
        """The step number loggers get now.

        [Note: logger steps]
        Lightning logs step metrics at the number of optimizer steps taken *before* the current
        one (the first step logs at 0), and epoch-end training metrics at that of the epoch's
        last step; validation in the middle of training logs at the count so far. fullshard uses
        the same numbers, so curves of a ported script line up with its Lightning ones.
        """
        return self._batches_that_stepped

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on global rank 0 only."""
        if self.is_global_zero:
            print(*args, **kwargs)

    # ---------------------------------------------------------------------------- entry points
    def fit(
        self,
        model: Module,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        datamodule: DataModule | None = None,
        ckpt_path: str | Path | None = None,
        *,
        ckpt_weights_only: bool = False,
        ckpt_verify: bool = True,
        trust_checkpoint: bool = False,
    ) -> None:
        """Train ``model``; resume from ``ckpt_path`` (a path, ``"last"`` or ``"best"``) when given.

        ``"last"`` is the newest complete checkpoint in the ModelCheckpoint directories, or a fresh
        start (with a warning) when there is none: the same command starts a torchrun job and
        resumes it after each restart (docs/launching.md, "Elastic restarts with torchrun").

        Data comes from ``train_dataloaders``/``val_dataloaders``, a ``datamodule`` (also accepted
        in place of ``train_dataloaders``), or the module's own ``train_dataloader()``/``val_dataloader()``.
        ``ckpt_weights_only``: load only the checkpoint's weights and train from there with fresh
        optimizers, schedulers and step counters (fine-tuning; a checkpoint saved with
        ``weights_only=True`` needs it). ``ckpt_verify``: check the checkpoint's CRC-32s first
        (docs/checkpoints.md); False loads a damaged checkpoint as it is. ``trust_checkpoint``:
        unpickle the checkpoint unrestricted, which runs any code its files name: only for one from
        someone you trust. By default anything but plain data (tensors, numbers, strings, lists,
        dicts) is refused with ``UntrustedCheckpointError`` before anything loads
        (docs/checkpoints.md, "Loading checkpoints you did not write").
        """
        if isinstance(train_dataloaders, DataModule):
            datamodule, train_dataloaders = train_dataloaders, None
        self._ckpt_options = checkpointing.load_options(
            ckpt_path, ckpt_weights_only, ckpt_verify, trust_checkpoint
        )
        sources = self._sources(datamodule, train=train_dataloaders, val=val_dataloaders)
        self._preflight("fit", model, sources)
        self._launch(self._run, "fit", model, sources, ckpt_path)

    def validate(
        self,
        model: Module | None = None,
        dataloaders: Any = None,
        ckpt_path: str | Path | None = None,
        verbose: bool = True,
        datamodule: DataModule | None = None,
        *,
        ckpt_verify: bool = True,
        trust_checkpoint: bool = False,
    ) -> list[dict[str, float]]:
        """Run one validation pass; returns ``[metrics]`` (the epoch values logged in it).
        ``ckpt_verify``, ``trust_checkpoint``: as for :meth:`fit`."""
        self._ckpt_options = checkpointing.load_options(ckpt_path, False, ckpt_verify, trust_checkpoint)
        return self._evaluate("validate", model, dataloaders, ckpt_path, verbose, datamodule)  # type: ignore[no-any-return]

    def test(
        self,
        model: Module | None = None,
        dataloaders: Any = None,
        ckpt_path: str | Path | None = None,
        verbose: bool = True,
        datamodule: DataModule | None = None,
        *,
        ckpt_verify: bool = True,
        trust_checkpoint: bool = False,
    ) -> list[dict[str, float]]:
        """Run one pass over the test data with ``test_step``; returns ``[metrics]``.
        ``ckpt_verify``, ``trust_checkpoint``: as for :meth:`fit`."""
        self._ckpt_options = checkpointing.load_options(ckpt_path, False, ckpt_verify, trust_checkpoint)
        return self._evaluate("test", model, dataloaders, ckpt_path, verbose, datamodule)  # type: ignore[no-any-return]

    def predict(
        self,
        model: Module | None = None,
        dataloaders: Any = None,
        datamodule: DataModule | None = None,
        return_predictions: bool | None = None,
        ckpt_path: str | Path | None = None,
        *,
        ckpt_verify: bool = True,
        trust_checkpoint: bool = False,
    ) -> list[Any] | None:
        """Run ``predict_step`` over the prediction data; returns the list of per-batch predictions.

        As in Lightning, each process predicts its own share of the data (the distributed
        sampler's split; when the dataset does not divide evenly some samples are repeated to keep
        the processes in step), and the list returned is this process's. On global rank 0 with
        the default launcher that is the process that called ``predict``; gather across
        processes with ``self.all_gather`` in ``on_predict_epoch_end`` if you need all of them.
        ``ckpt_verify``, ``trust_checkpoint``: as for :meth:`fit`.
        """
        self._ckpt_options = checkpointing.load_options(ckpt_path, False, ckpt_verify, trust_checkpoint)
        keep = True if return_predictions is None else return_predictions
        result = self._evaluate("predict", model, dataloaders, ckpt_path, False, datamodule, keep)
        return result if keep else None

    def _evaluate(
        self,
        stage: str,
        model: Module | None,
        dataloaders: Any,
        ckpt_path: str | Path | None,
        verbose: bool,
        datamodule: DataModule | None,
        keep_predictions: bool = True,
    ) -> Any:
        if isinstance(dataloaders, DataModule):
            datamodule, dataloaders = dataloaders, None
        if model is None:
            if self._module is None:
                raise MisconfigurationError(
                    f"Trainer.{stage}() was called without a model and no earlier fit() gave one. Pass the "
                    f"model: trainer.{stage}(model, dataloaders)."
                )
            model = self._module
            if ckpt_path is None and self._fitted and self._best_checkpoint() is not None:
                ckpt_path = "best"
                rank_zero_info(
                    f"Trainer.{stage}() without a model uses the best checkpoint of the previous fit; pass "
                    f"ckpt_path='last' or a path to choose another."
                )
        kind = "val" if stage == "validate" else stage
        sources = self._sources(datamodule, **{kind: dataloaders})
        self._preflight(stage, model, sources)
        return self._launch(self._run, stage, model, sources, ckpt_path, verbose, keep_predictions)

    def save_checkpoint(self, filepath: str | Path, weights_only: bool = False) -> None:
        """Write a checkpoint of the whole training state to ``filepath``.

        Every process must call this (it gathers per-rank state); global rank 0 writes the file
        (or each process its shards, with ``state_dict_type="sharded"``). ``weights_only``: leave
        out optimizer and scheduler states. With ``FSDP2Strategy(async_save=True)`` it returns once
        the state is copied to host memory; the checkpoint is committed in the background, and
        the next save, the end of ``fit`` or the process exit wait for it (docs/checkpoints.md).
        """
        if self._module is None or self._strategy.module is None:
            raise RuntimeError(
                "save_checkpoint() needs a model that was set up by fit(), validate(), test() or predict() first."
            )
        checkpoint = checkpointing.dump_checkpoint(self)
        optimizers = () if weights_only else self.optimizers
        if weights_only:
            checkpoint["lr_schedulers"] = []
        self._strategy.save_checkpoint(checkpoint, filepath, optimizers)

    def _sources(self, datamodule: Any, **loaders: Any) -> DataSources:
        if datamodule is not None and not isinstance(datamodule, DataModule):
            raise MisconfigurationError(
                f"datamodule must be a fullshard.DataModule, got {type(datamodule).__name__}. Subclass "
                "fullshard.DataModule (a LightningDataModule ports by changing its import)."
            )
        if datamodule is not None and any(v is not None for v in loaders.values()):
            raise MisconfigurationError(
                "Both dataloaders and a datamodule were given; pass one of them (the DataModule's "
                "*_dataloader() methods provide the loaders)."
            )
        for kind, loader in loaders.items():
            if loader is not None:
                single_loader(loader, kind)
        return DataSources(datamodule, **loaders)

    def _preflight(self, stage: str, model: Any, sources: DataSources) -> None:
        """Find what needs no process before starting any (see docs/lightning.md, errors)."""
        if not isinstance(model, Module):
            raise MisconfigurationError(
                f"Trainer expects a fullshard.Module, got {type(model).__name__}. Subclass fullshard.Module "
                "(fullshard.LightningModule is the same class) and define training_step and "
                "configure_optimizers."
            )
        self._module = model
        self._datamodule = sources.datamodule
        check_lightning_only_hooks(model)
        step = {"fit": "training_step", "validate": "validation_step", "test": "test_step"}.get(stage)
        if step is not None and not overrides(model, Module, step):
            raise MisconfigurationError(
                f"Trainer.{stage}() needs {type(model).__name__}.{step}(batch, batch_idx), which is not "
                f"defined. Define it in {type(model).__name__}."
            )
        kind = {"fit": "train", "validate": "val"}.get(stage, stage)
        if not sources.has(kind, model):
            raise MisconfigurationError(
                f"Trainer.{stage}() got no {kind} data: pass dataloaders, a datamodule= with "
                f"{kind}_dataloader(), or define {kind}_dataloader() in {type(model).__name__}."
            )
        if stage == "fit":
            if not overrides(model, Module, "configure_optimizers"):
                raise MisconfigurationError(
                    f"{type(model).__name__} does not define configure_optimizers(); the Trainer needs an "
                    "optimizer. Define it, e.g. `return torch.optim.AdamW(self.parameters(), lr=1e-3)`."
                )
            if sources.has("val", model) and not overrides(model, Module, "validation_step"):
                rank_zero_warn(
                    "Validation data was given but the module has no validation_step; validation is skipped."
                )

    def _preflight_optimizers(self, model: Module, sources: DataSources) -> None:
        """Check what configure_optimizers returns, when the model has its parameters already.

        Global rank 0 does it as the first thing in ``_run``, before joining the process group:
        the other processes are only starting then (importing torch), so a bad result ends the
        job at once with one message, and the check costs no start-up time (building a first
        optimizer imports ``torch._dynamo``, about a second, which would delay starting the
        others if done before launching them). A model whose layers are built in
        configure_model() (or that configure_optimizers cannot serve yet) is checked after setup
        instead. The optimizers built here are discarded.
        """
        if overrides(model, Module, "configure_model") or next(model.parameters(), None) is None:
            return
        self._raw_train_loader = sources.loaders.get("train")
        model.trainer = self
        try:
            config = model.configure_optimizers()
        except Exception:  # needs something only a running fit has: checked after setup instead
            return
        finally:
            model.trainer = None
            self._train_loader = self._raw_train_loader = None
        parse_optimizers(config)

    def _launch(self, function: Any, *args: Any) -> Any:
        launcher = self._strategy.launcher
        if launcher is None:
            return function(*args)
        return launcher.launch(function, *args, trainer=self)

    # ------------------------------------------------------------------------------- running
    def _run(
        self,
        stage: str,
        model: Module,
        sources: DataSources,
        ckpt_path: str | Path | None,
        verbose: bool = True,
        keep_predictions: bool = True,
    ) -> Any:
        strategy = self._strategy
        if stage == "fit" and self.world_size > 1 and self.is_global_zero:
            self._preflight_optimizers(model, sources)
        strategy.setup_environment()
        rank_zero_only.rank = self.global_rank  # type: ignore[attr-defined]
        self._stage = stage
        self._module = model
        self._datamodule = sources.datamodule
        self._metrics.reset()  # as in Lightning, each call starts with no metrics
        model.trainer = self
        self._hooks = self._build_hooks(model)
        self._configure_torch()
        datamodule = sources.datamodule
        if datamodule is not None:
            datamodule.trainer = self
        try:
            if self.local_rank == 0:  # once per machine; the others wait
                if datamodule is not None:
                    datamodule.prepare_data()
                model.prepare_data()
            strategy.barrier("prepare_data")
            if datamodule is not None:
                datamodule.setup(stage)
            self._call("setup", stage)
            with torch.autograd.set_detect_anomaly(self.detect_anomaly):
                return self._run_stage(stage, model, sources, ckpt_path, verbose, keep_predictions)
        except BaseException as exception:
            strategy.on_exception(exception)
            for cb in self.callbacks:
                cb.on_exception(self, model, exception)
            _finish_background_save(strategy, exception)
            self._finalize_loggers("failed")
            raise
        finally:
            if datamodule is not None:
                datamodule.teardown(stage)
            self._call("teardown", stage)
            self._stage = None

    def _run_stage(
        self,
        stage: str,
        model: Module,
        sources: DataSources,
        ckpt_path: str | Path | None,
        verbose: bool,
        keep_predictions: bool,
    ) -> Any:
        self._resolved_ckpt_path = None
        self._pending_loop_state = None
        self._data = sources
        self._setup_model(model, stage, sources)
        if stage != "fit":
            self._setup_data(stage, model, sources)
        checkpoint = self._load_checkpoint(ckpt_path, stage) if ckpt_path is not None else None
        self.ckpt_path = self._resolved_ckpt_path
        if stage != "fit":
            if stage == "predict":
                result: Any = evaluation.run_predict(self, keep_predictions)
            else:
                metrics = evaluation.run_validation(self) if stage == "validate" else evaluation.run_test(self)
                if verbose and self.is_global_zero and metrics:
                    self.print(format_results(stage, metrics))
                result = [metrics]
            self._finalize_loggers("success")
            return result
        self._log_hyperparams(model)
        if self.enable_model_summary and self.is_global_zero:
            log.info(model_summary(model, self._strategy.parameter_sizes(model)))
        self.should_stop = False
        self._call("on_fit_start")
        self._preemption = preemption.Preemption(self._preemption_signals, self._requeue_on_preemption)
        if self._preemption_signals:
            self._preemption.start(self)
        try:
            loops.run_fit(self, model, sources, checkpoint)
        finally:
            self._preemption.stop()
        self._call("on_fit_end")
        # fit returns once every checkpoint it started is committed; a failed one raises here
        self._strategy.wait_for_checkpoint()
        self._fitted = True
        if isinstance(self._strategy.launcher, SpawnLauncher):
            # gathering the weights is collective (FSDP): every rank takes part, rank 0 sends them
            self._spawn_state = {k: v.detach().cpu() for k, v in self._strategy.module_state_dict().items()}
        self._finalize_loggers("success")
        return None

    _fitted = False
    _ckpt_options = checkpointing.LoadOptions()  # how the current call loads its ckpt_path

    def _configure_torch(self) -> None:
        if self.deterministic is not None:
            torch.use_deterministic_algorithms(bool(self.deterministic), warn_only=self.deterministic == "warn")
            if self.deterministic and self._strategy.root_device.type == "cuda":
                os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        if self.benchmark is not None:
            torch.backends.cudnn.benchmark = self.benchmark

    def _build_hooks(self, module: Module) -> dict[str, list[Callable[..., Any]]]:
        """For every hook, the callables to call in order: the callbacks that override it, then the
        module if it does; checkpointing and early stopping come after the module in
        ``on_train_epoch_end`` so they see what it logged (Lightning's order)."""
        monitors = _monitoring_types()
        hooks: dict[str, list[Callable[..., Any]]] = {}
        for name in _HOOKS:
            callbacks = [cb for cb in self.callbacks if overrides(cb, Callback, name)]
            monitoring = [
                cb for cb in callbacks if name == "on_train_epoch_end" and isinstance(cb, monitors)
            ]
            calls: list[Callable[..., Any]] = [
                functools.partial(getattr(cb, name), self, module) for cb in callbacks if cb not in monitoring
            ]
            module_hook = self._module_hook(name, module)
            if module_hook is not None:
                calls.append(module_hook)
            calls += [functools.partial(getattr(cb, name), self, module) for cb in monitoring]
            hooks[name] = calls
        return hooks

    def _module_hook(self, name: str, module: Module | None = None) -> Callable[..., Any] | None:
        """The module's ``name`` hook when it overrides it, else None."""
        module = module if module is not None else self.lightning_module
        if name in _CALLBACK_ONLY or not overrides(module, Module, name):
            return None
        return getattr(module, name)  # type: ignore[no-any-return]

    def _setup_model(self, model: Module, stage: str, sources: DataSources) -> None:
        strategy = self._strategy
        existing = {id(p) for p in model.parameters()}
        with strategy.tensor_init_context(), strategy.model_sharded_context():
            model.configure_model()
        _init_new_layers(model, existing)
        strategy.setup_module(model)
        if stage == "fit":
            self._train_loader = None
            optimizers, self.lr_scheduler_configs = parse_optimizers(model.configure_optimizers())
            self.optimizers = [strategy.setup_optimizer(o) for o in optimizers]

    def _should_validate(self, batches_done: int) -> bool:
        """Whether validation runs after the ``batches_done``-th batch of this epoch (Lightning's rule)."""
        every = self._val_check_batch
        if not every:
            return False
        n_epoch = self.check_val_every_n_epoch
        if n_epoch is not None and (self.current_epoch + 1) % n_epoch != 0:
            return False
        if self._stop_requested():
            return True
        if math.isinf(every):
            return self.is_last_batch
        count = self._total_batch_idx if n_epoch is None else batches_done
        return count % every == 0  # type: ignore[operator]

    def _load_checkpoint(self, ckpt_path: str | Path, stage: str) -> dict[str, Any] | None:
        path = self._resolved_ckpt_path = self._resolve_ckpt_path(ckpt_path, stage)
        if path is None:
            return None
        options = self._ckpt_options
        if stage != "fit" or options.weights_only:
            checkpoint = self._strategy.load_checkpoint(
                path, weights_only=True, verify=options.verify, trust_checkpoint=options.trust
            )
            module = self.lightning_module
            module.on_load_checkpoint(checkpoint)
            for callback in self.callbacks:
                callback.on_load_checkpoint(self, module, checkpoint)
            return checkpoint if stage != "fit" else None  # fine-tuning: fresh loops and RNG states
        checkpoint = self._strategy.load_checkpoint(
            path,
            self.optimizers,
            check=checkpointing.scheduler_check(self, path),
            verify=options.verify,
            trust_checkpoint=options.trust,
        )
        checkpointing.restore_checkpoint(self, checkpoint)
        return checkpoint

    def _best_checkpoint(self) -> str | None:
        callback = self.checkpoint_callback
        return callback.best_model_path or None if callback is not None else None

    def _resolve_ckpt_path(self, ckpt_path: str | Path, stage: str) -> str | None:
        if str(ckpt_path) == "best":
            best = self._best_checkpoint()
            if best is None:
                raise MisconfigurationError(
                    f"{stage}(ckpt_path='best') needs a best checkpoint, but "
                    + (
                        "the Trainer has no ModelCheckpoint callback."
                        if self.checkpoint_callback is None
                        else "its ModelCheckpoint has saved none yet (fit first)."
                    )
                    + " Pass ckpt_path='last' or a path instead."
                )
            return best
        if str(ckpt_path) != "last":
            return str(ckpt_path)
        return checkpointing.newest_checkpoint(self, stage)

    # ----------------------------------------------------------------- helpers for the loops
    def _call(self, hook: str, *args: Any) -> None:
        for function in self._hooks.get(hook, ()):
            function(*args)

    def _can_stop_early(self) -> bool:
        epochs_ok = self.min_epochs is None or self.current_epoch >= self.min_epochs  # finished epochs
        steps_ok = self.min_steps is None or self.global_step >= self.min_steps
        return epochs_ok and steps_ok

    def _stop_requested(self) -> bool:
        return self.should_stop and self._can_stop_early()

    def _done(self) -> bool:
        if self.num_training_batches == 0:
            return True
        if self.max_steps >= 0 and self.global_step >= self.max_steps:
            return True
        if self.max_epochs >= 0 and self.current_epoch >= self.max_epochs:
            return True
        if self.should_stop:
            if self._can_stop_early():
                return True
            self.should_stop = False  # Lightning's rule: min_epochs/min_steps win over a stop request
        return False

    def _loop_state(self) -> dict[str, Any]:
        epoch, batches, samples = self._resume_point or (
            self.current_epoch,
            self._batches_in_epoch,
            self._samples_in_epoch(),
        )
        return {
            "epoch": epoch,
            "global_step": self.global_step,
            "batches_in_epoch": batches,
            "samples_in_epoch": samples,
            "epoch_finished": self._epoch_finished,
            "total_batch_idx": self._total_batch_idx,
            "data_seed": self._train_loader.seed if self._train_loader is not None else current_seed(),
        }

    def _samples_in_epoch(self) -> int | None:
        """How many positions of this epoch's order the processes together have consumed (see
        [Note: resuming at another world size]); None where the training loader has no such order."""
        if self._saved_position is not None:  # restored, not yet placed in this run's loader
            return self._saved_position.samples
        loader = self._train_loader
        return None if loader is None else loader.samples_consumed(self._epoch_start, self._batches_in_epoch)

    def _restore_loop_state(self, state: dict[str, Any], *, epoch_end_pending: bool = False) -> None:
        """Put loop progress back. ``epoch_end_pending``: a checkpoint written at the end of an
        epoch keeps that epoch's number until training starts (Lightning shows it during the
        sanity run); :meth:`_finish_epoch_restore` moves on to the next epoch."""
        self.global_step = int(state["global_step"])
        self._batches_that_stepped = self.global_step
        self.current_epoch = int(state["epoch"])
        self._batches_in_epoch = int(state["batches_in_epoch"])
        samples, world_size = state.get("samples_in_epoch"), state.get("world_size")
        self._saved_position = SavedPosition(
            batches=self._batches_in_epoch,
            samples=None if samples is None else int(samples),
            world_size=None if world_size is None else int(world_size),
        )
        self._epoch_start = (self._batches_in_epoch, 0)  # placed by _finish_epoch_restore
        self._total_batch_idx = int(state.get("total_batch_idx", 0))
        seed = state.get("data_seed")  # None in checkpoints written before it was recorded
        self._data_seed = None if seed is None else int(seed)
        self._epoch_finished = False
        self._epoch_end_pending = bool(state.get("epoch_finished"))
        if not epoch_end_pending:
            self._finish_epoch_restore()

    def _finish_epoch_restore(self) -> None:
        """Move on past an epoch that ended at the checkpoint, or place the restored position in
        the training loader of this run (which may run on another number of processes)."""
        if self._epoch_end_pending:
            self.current_epoch += 1
            self._batches_in_epoch = 0
            self._epoch_start = (0, 0)
            self._epoch_end_pending = False
            self._saved_position = None
        position, loader = self._saved_position, self._train_loader
        if self._data_seed is not None and loader is not None:
            if self._data_seed != loader.seed:
                rank_zero_warn(
                    f"Resuming with the data order of the checkpoint (seed {self._data_seed}), not of this run's "
                    f"seed ({loader.seed}), so that training goes on with the samples it would have seen. To "
                    "train on another order, start from the checkpoint's weights (ckpt_weights_only=True).",
                    stacklevel=2,
                )
            loader.reseed(self._data_seed)
            self._data_seed = None
        if position is not None and loader is not None:
            self._saved_position = None
            self._epoch_start = loader.resume_start(position, self.current_epoch)
            self._batches_in_epoch = self._epoch_start[0]

    def _log_metrics(self, values: dict[str, float], step: int) -> None:
        if self.is_global_zero and self.loggers:
            values = {**values, "epoch": float(self.current_epoch)}
            for logger in self.loggers:
                logger.log_metrics(values, step=step)

    def _log_hyperparams(self, model: Module) -> None:
        if self.is_global_zero and model.hparams:
            for logger in self.loggers:
                logger.log_hyperparams(dict(model.hparams))

    def _finalize_loggers(self, status: str) -> None:
        if self.is_global_zero:
            for logger in self.loggers:
                logger.finalize(status)

    # -------------------------------------------------------------- spawn launcher protocol
    def _get_spawn_result(self) -> dict[str, Any]:
        """What a spawned rank 0 sends back to the parent process (see SpawnLauncher)."""
        return {
            "state_dict": self._spawn_state,
            "callback_metrics": {k: v.cpu() for k, v in self.callback_metrics.items()},
            "logged_metrics": {k: v.cpu() for k, v in self.logged_metrics.items()},
            "global_step": self.global_step,
            "current_epoch": self.current_epoch,
            "best_model_path": self._best_checkpoint(),
        }

    def _apply_spawn_result(self, result: dict[str, Any]) -> None:
        """Bring the trained weights and counters into the parent process's objects."""
        module = self._module
        if module is not None and result["state_dict"]:
            module.configure_model()
            module.load_state_dict(result["state_dict"])
            self._fitted = True
        self._metrics.callback_metrics.update(result["callback_metrics"])
        self._metrics.logged_metrics.update(result["logged_metrics"])
        self.global_step = result["global_step"]
        self.current_epoch = result["current_epoch"]
        callback = self.checkpoint_callback
        if callback is not None and result.get("best_model_path"):
            callback.best_model_path = result["best_model_path"]


def _finish_background_save(strategy: Strategy, exception: BaseException) -> None:
    """When a run fails, let the checkpoint being written in the background (``async_save``)
    commit: it is complete, and the last state before the failure. Its own failure, if any, is
    reported beside the run's exception, which goes on."""
    try:
        strategy.wait_for_checkpoint()
    except CheckpointError as err:
        warnings.warn(f"{err} (The run itself failed with {type(exception).__name__}.)", stacklevel=3)


def _init_new_layers(model: Module, existing: set[int]) -> None:
    """Run the module's ``init_weights`` override on the layers ``configure_model`` built for real
    (meta-device layers get it as FSDP materialises them, see [Note: exact meta-device
    initialisation]); layers sharded by hand inside ``configure_model`` are left alone."""
    hook = user_init_of(model)
    if hook is None or any(p.is_meta for p in model.parameters()):
        return
    from torch.distributed.fsdp import FullyShardedDataParallel

    if any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
        return
    init_new_modules(model, hook, existing)
