"""The Trainer: the user-facing facade. It checks its arguments, builds the strategy, callbacks,
loggers and loops, and runs ``fit``/``validate``/``test``/``predict`` by launching the processes,
setting the model up and handing over to a loop (``trainer/loops/``), which owns the progress.

Data flows one way: Trainer -> loops -> Strategy -> (precision, policies, checkpoint) -> torch.
Modules outside this file use the Trainer's public surface only (``src/fullshard/README.md``).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch.optim import Optimizer

from fullshard.checkpoint.manager import CheckpointManager, LoadOptions, load_options, previous_fits_best
from fullshard.compile import parse_compile
from fullshard.datamodule import DataModule
from fullshard.errors import MisconfigurationError
from fullshard.launch import SpawnLauncher
from fullshard.module import Module
from fullshard.optimizer_config import LRSchedulerConfig, parse_optimizers
from fullshard.profilers import Profiler, profiled_call, resolve_profiler
from fullshard.rank_zero import set_global_rank
from fullshard.strategies import Strategy
from fullshard.trainer import arguments, call, nonfinite, preemption, states
from fullshard.trainer.callback_setup import attach_model_callbacks, build_callbacks
from fullshard.trainer.callbacks.base import Callback
from fullshard.trainer.callbacks.on_exception_checkpoint import fit_resume_path
from fullshard.trainer.devices import configure_torch, configured_strategy
from fullshard.trainer.hooks import Hooks, start_fit
from fullshard.trainer.logger_setup import build_loggers
from fullshard.trainer.loggers.base import Logger
from fullshard.trainer.loggers.dispatch import finalize_loggers, log_run_start
from fullshard.trainer.loop_settings import LoopSettings, apply_barebones, loop_settings, run_logger
from fullshard.trainer.loops import EvaluationLoop, FitLoop
from fullshard.trainer.metrics import MetricsCollector
from fullshard.trainer.model_setup import set_up_model
from fullshard.trainer.preflight import (
    DataSources,
    check_call,
    check_manual_optimization,
    check_optimizers_early,
    make_sources,
)
from fullshard.trainer.properties import TrainerProperties
from fullshard.trainer.spawn_result import apply_spawn_report, spawn_report
from fullshard.trainer.summary import format_results


class Trainer(TrainerProperties):
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
            (:attr:`precision` gives the canonical name); Lightning's ``plugins=``: :mod:`fullshard.plugins`.
        logger: a :class:`~fullshard.loggers.Logger`, a list of them, False, or True/None for Lightning's
            default (TensorBoard when installed, else CSV) in ``default_root_dir/lightning_logs``.
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
        enable_progress_bar: add a progress bar (``RichProgressBar`` with ``rich``, else ``TQDMProgressBar``).
        enable_model_summary: add a ``ModelSummary`` (``RichModelSummary`` with ``rich``), shown when fit starts.
        accumulate_grad_batches: micro-batches per optimizer step.
        gradient_clip_val: clip gradients to this norm (or value, see ``gradient_clip_algorithm``).
        gradient_clip_algorithm: ``"norm"`` (default) or ``"value"``.
        deterministic: ``torch.use_deterministic_algorithms`` (True, or ``"warn"`` to warn only).
        benchmark: ``torch.backends.cudnn.benchmark`` (None leaves it as it is).
        inference_mode: accepted for Lightning compatibility; evaluation runs under
            ``torch.no_grad`` (inference tensors cannot be used by FSDP afterwards).
        use_distributed_sampler: rebuild map-style loaders around a distributed, resumable
            sampler, which shuffles the training data under a distributed strategy as Lightning's;
            ``"keep_shuffle"``: the loader's own order; False: loaders as given (getting-started.md).
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
            with ``NonFiniteLossError`` naming the step and ranks (before that optimizer step on
            the CPU, at most one step later on a GPU, where the loss is read without waiting);
            ``"skip"`` skips that optimizer step on every rank; None does not check (it warns
            once, on rank 0, when it sees one). Not a Lightning option; see docs/checkpoints.md
            for its cost.
        max_consecutive_nonfinite_skips: with ``on_nonfinite_loss="skip"``, how many optimizer
            steps in a row may be skipped; the next non-finite loss raises ``NonFiniteLossError``
            saying how many were skipped (default 25). Not a Lightning option.
        max_time, profiler, sync_batchnorm, overfit_batches, reload_dataloaders_every_n_epochs:
            Lightning's (docs/lightning.md; ``max_time``'s Timer: docs/callbacks.md; profilers:
            docs/profiling.md).
        enable_autolog_hparams: send the module's ``hparams`` to the loggers when ``fit`` starts
            (Lightning's; default True).
        barebones: Lightning's barebones mode: checkpointing, logging (``self.log`` does nothing),
            the progress bar, the model summary and the sanity check off; turning one of them,
            ``fast_dev_run``, ``detect_anomaly`` or a profiler on is a ``ValueError``.
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
        use_distributed_sampler: bool | str = True,
        detect_anomaly: bool = False,
        default_root_dir: str | Path | None = None,
        compile: bool | dict[str, Any] | None = None,
        preemption_signals: Any = preemption.DEFAULT_SIGNALS,
        requeue_on_preemption: bool = True,
        on_nonfinite_loss: str | None = "raise",
        max_consecutive_nonfinite_skips: int = nonfinite.DEFAULT_MAX_SKIPS,
        max_time: str | timedelta | dict[str, int] | None = None,
        profiler: Profiler | str | None = None,
        sync_batchnorm: bool = False,
        overfit_batches: int | float = 0.0,
        reload_dataloaders_every_n_epochs: int = 0,
        barebones: bool = False,
        enable_autolog_hparams: bool = True,
        plugins: Any = None,
        **lightning_only: Any,
    ) -> None:
        arguments.reject_unknown(lightning_only)
        arguments.check_each(locals())  # here, locals() is the arguments by name
        given = apply_barebones(locals())
        #: Lightning's barebones mode: no checkpoints, logging, progress bar, model summary or sanity check.
        self.barebones = barebones
        self.enable_autolog_hparams = enable_autolog_hparams
        settings = loop_settings(given)
        self.profiler = resolve_profiler(profiler)
        compile_config = parse_compile(compile, "Trainer")
        self._preemption_signals = preemption.parse_signals(preemption_signals)
        # [Note: agreeing on a non-finite loss]
        on_nonfinite = nonfinite.parse(on_nonfinite_loss, max_consecutive_nonfinite_skips)
        self._keep_settings(settings, given)
        self._accelerator, self._strategy = configured_strategy(
            accelerator, strategy, devices, num_nodes, precision, compile_config, sync_batchnorm, plugins
        )
        checkpointing = given["enable_checkpointing"] is not False
        progress_bar = given["enable_progress_bar"] is not False
        self.callbacks = build_callbacks(
            callbacks, checkpointing, progress_bar, max_time, self.enable_model_summary
        )
        self.loggers = build_loggers(run_logger(given["logger"], self.fast_dev_run), self.default_root_dir)
        self._init_run_state()
        self._build_loops(on_nonfinite, requeue_on_preemption)

    def _keep_settings(self, settings: LoopSettings, given: dict[str, Any]) -> None:
        """Keeps the checked settings as the Trainer's public attributes, which Lightning users
        read and set (``given``: the arguments by name, barebones applied)."""
        self.fast_dev_run = settings.fast_dev_run
        self.overfit_batches = settings.overfit_batches
        self.reload_dataloaders_every_n_epochs = settings.reload_dataloaders_every_n_epochs
        self.limit_train_batches = settings.limit_train_batches
        self.limit_val_batches = settings.limit_val_batches
        self.limit_test_batches = settings.limit_test_batches
        self.limit_predict_batches = settings.limit_predict_batches
        self.max_steps = settings.max_steps
        self.max_epochs = settings.max_epochs
        self.min_epochs = settings.min_epochs
        self.min_steps = settings.min_steps
        self.val_check_interval = settings.val_check_interval
        self.check_val_every_n_epoch = settings.check_val_every_n_epoch
        self.num_sanity_val_steps = settings.num_sanity_val_steps
        self.accumulate_grad_batches = settings.accumulate_grad_batches
        self.gradient_clip_val = settings.gradient_clip_val
        self.gradient_clip_algorithm = settings.gradient_clip_algorithm
        self.log_every_n_steps = settings.log_every_n_steps
        self.deterministic = given["deterministic"]
        self.benchmark = given["benchmark"]
        self.inference_mode = given["inference_mode"]
        self.use_distributed_sampler = arguments.check_sampler_option(given["use_distributed_sampler"])
        self.detect_anomaly = given["detect_anomaly"]
        self.enable_model_summary = given["enable_model_summary"] is not False
        root = given["default_root_dir"]
        self.default_root_dir = str(root) if root is not None else os.getcwd()

    def _init_run_state(self) -> None:
        """The state of a call (``fit``, ``validate``, ...) that the loops and callbacks read."""
        self.should_stop = False
        self.state = states.TrainerState()  # the call, its status and stage (fullshard.trainer.states)
        self.is_last_batch = False
        self.batch_idx_start = 0
        self.optimizers: list[Optimizer] = []
        self.lr_scheduler_configs: list[LRSchedulerConfig] = []
        self.ckpt_path: str | None = None  # the checkpoint the current call loaded, if any
        self._stage: str | None = None
        self._module: Module | None = None
        self._datamodule: DataModule | None = None
        self._data: DataSources | None = None  # where the current call's loaders come from
        self._metrics = MetricsCollector(self._strategy.all_reduce_data_parallel)
        self._spawn_state: dict[str, torch.Tensor] = {}

    def _build_loops(self, on_nonfinite: nonfinite.NonFiniteLoss, requeue_on_preemption: bool) -> None:
        """The checkpoint manager and the loops, which own the progress of each stage."""
        #: Builds, saves and loads this Trainer's checkpoints (fullshard's own; not in Lightning).
        self.checkpoint_manager = CheckpointManager(self)
        self._strategy.checkpointer = self.checkpoint_manager.checkpointer  # its save_/load_checkpoint too
        self.validate_loop = EvaluationLoop(self, self._metrics, "validate")
        self.test_loop = EvaluationLoop(self, self._metrics, "test")
        self.predict_loop = EvaluationLoop(self, self._metrics, "predict")
        self.fit_loop = FitLoop(
            self,
            self._metrics,
            self.validate_loop,
            on_nonfinite_loss=on_nonfinite,
            preemption_signals=self._preemption_signals,
            requeue_on_preemption=requeue_on_preemption,
        )

    # ---------------------------------------------------------------------------- entry points
    def fit(
        self,
        model: Module,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        datamodule: DataModule | None = None,
        ckpt_path: str | Path | None = None,
        weights_only: bool | None = None,
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
        (docs/checkpoints.md, "Loading checkpoints you did not write"). ``weights_only``:
        Lightning's; True reads plain data only (the default), False is ``trust_checkpoint=True``.
        """
        if isinstance(train_dataloaders, DataModule):
            datamodule, train_dataloaders = train_dataloaders, None
        self._ckpt_options = load_options(
            ckpt_path, ckpt_weights_only, ckpt_verify, trust_checkpoint, weights_only
        )
        sources = make_sources(datamodule, train=train_dataloaders, val=val_dataloaders)
        self._preflight("fit", model, sources)
        self._launch("fit", model, sources, fit_resume_path(self, ckpt_path))

    def validate(
        self,
        model: Module | None = None,
        dataloaders: Any = None,
        ckpt_path: str | Path | None = None,
        verbose: bool = True,
        datamodule: DataModule | None = None,
        weights_only: bool | None = None,
        *,
        ckpt_verify: bool = True,
        trust_checkpoint: bool = False,
    ) -> list[dict[str, float]]:
        """Run one validation pass; returns the epoch values logged in it, one dict per dataloader
        (``dataloaders``: one DataLoader, or a list, tuple or dict of them, run in turn).
        ``ckpt_verify``, ``trust_checkpoint``, ``weights_only``: as for :meth:`fit`."""
        self._ckpt_options = load_options(ckpt_path, False, ckpt_verify, trust_checkpoint, weights_only)
        return self._evaluate("validate", model, dataloaders, ckpt_path, verbose, datamodule)  # type: ignore[no-any-return]

    def test(
        self,
        model: Module | None = None,
        dataloaders: Any = None,
        ckpt_path: str | Path | None = None,
        verbose: bool = True,
        datamodule: DataModule | None = None,
        weights_only: bool | None = None,
        *,
        ckpt_verify: bool = True,
        trust_checkpoint: bool = False,
    ) -> list[dict[str, float]]:
        """Run one pass over the test data with ``test_step``; returns one metrics dict per dataloader.
        ``ckpt_verify``, ``trust_checkpoint``, ``weights_only``: as for :meth:`fit`."""
        self._ckpt_options = load_options(ckpt_path, False, ckpt_verify, trust_checkpoint, weights_only)
        return self._evaluate("test", model, dataloaders, ckpt_path, verbose, datamodule)  # type: ignore[no-any-return]

    def predict(
        self,
        model: Module | None = None,
        dataloaders: Any = None,
        datamodule: DataModule | None = None,
        return_predictions: bool | None = None,
        ckpt_path: str | Path | None = None,
        weights_only: bool | None = None,
        *,
        ckpt_verify: bool = True,
        trust_checkpoint: bool = False,
    ) -> list[Any] | None:
        """Run ``predict_step`` over the prediction data; returns the list of per-batch predictions
        (a list per dataloader when several are given; None with ``return_predictions=False``, the
        way to predict with a ``BasePredictionWriter`` and keep nothing in memory).

        As in Lightning, each process predicts its own share of the data (the distributed
        sampler's split; when the dataset does not divide evenly some samples are repeated to keep
        the processes in step), and the list returned is this process's. On global rank 0 with
        the default launcher that is the process that called ``predict``; gather across
        processes with ``self.all_gather`` in ``on_predict_epoch_end`` if you need all of them.
        ``ckpt_verify``, ``trust_checkpoint``, ``weights_only``: as for :meth:`fit`.
        """
        self._ckpt_options = load_options(ckpt_path, False, ckpt_verify, trust_checkpoint, weights_only)
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
            if ckpt_path is None and self._fitted:
                ckpt_path = previous_fits_best(self, stage)
        kind = "val" if stage == "validate" else stage
        sources = make_sources(datamodule, **{kind: dataloaders})
        self._preflight(stage, model, sources)
        return self._launch(stage, model, sources, ckpt_path, verbose, keep_predictions)

    @contextlib.contextmanager
    def init_module(self, empty_init: bool | None = None) -> Iterator[None]:
        """Build the module inside this context (``with trainer.init_module(): model = Model()``)
        to create its tensors on the strategy's device and in the precision's dtype at once.

        ``empty_init``: create the parameters without memory (on the meta device) and fill them
        when the strategy sets the model up; None lets the strategy decide (FSDP's
        ``empty_init=``, else False). Under FSDP, building the layers in ``configure_model``
        instead shards them as they are built (docs/fsdp/fast-init.md).
        """
        with self._strategy.tensor_init_context(empty_init=empty_init):
            yield

    def save_checkpoint(
        self, filepath: str | Path, weights_only: bool = False, storage_options: Any = None
    ) -> None:
        """Write a checkpoint of the whole training state to ``filepath``.

        Every process must call this (it gathers per-rank state); global rank 0 writes the file
        (or each process its shards, with ``state_dict_type="sharded"``). ``weights_only``: leave
        out optimizer and scheduler states. With ``FSDP2Strategy(async_save=True)`` it returns at
        once: the state is copied (the next optimizer step waits for that) and committed in the
        background; the next save, the end of ``fit`` or the process exit wait (docs/checkpoints.md).
        """
        if self._module is None or self._strategy.module is None:
            raise RuntimeError(
                "save_checkpoint() needs a model that was set up by fit(), validate(), test() or predict() first."
            )
        with self.profiler.profile("save_checkpoint"):  # as Lightning's; [Note: profiling at the dispatch]
            self.checkpoint_manager.save(filepath, weights_only, storage_options)

    def _preflight(self, stage: str, model: Any, sources: DataSources) -> None:
        check_call(stage, model, sources)
        if stage == "fit":
            check_manual_optimization(self, model)
        self._module = model
        self._datamodule = sources.datamodule

    def _launch(self, *args: Any) -> Any:
        """Run :meth:`_run` with ``args`` in every process of the job."""
        launcher = self._strategy.launcher
        if launcher is None:
            return self._run(*args)
        if isinstance(launcher, SpawnLauncher):  # rank 0's results come back to this process
            value, state = launcher.launch(self._run_and_report, *args, trainer=self)
            self._apply_spawn_result(state)
            return value
        return launcher.launch(self._run, *args, trainer=self)

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
            check_optimizers_early(self, model, sources)
        strategy.setup_environment()
        set_global_rank(self.global_rank)
        self._stage = stage
        call.start(self.state, stage)
        self._module = model
        self._datamodule = datamodule = sources.datamodule
        self._metrics.reset()  # as in Lightning, each call starts with no metrics
        model.trainer = self
        self.callbacks = attach_model_callbacks(self.callbacks, model)
        hooks = Hooks(self, self.callbacks, model)
        configure_torch(self.deterministic, self.benchmark, strategy.root_device)
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
            hooks.call("setup", stage)
            with torch.autograd.set_detect_anomaly(self.detect_anomaly), profiled_call(self, stage):
                return self._run_stage(stage, model, sources, ckpt_path, hooks, verbose, keep_predictions)
        except call.TunerExit:  # a tuner's search ended this call on purpose (fullshard.tuner.Tuner)
            return None
        except BaseException as exception:
            call.handle_failure(self, exception, hooks)  # SystemExit(1) after Ctrl+C
            raise
        finally:  # the teardown hooks run after a call that did not raise only, as in Lightning
            call.teardown(self.state, datamodule, hooks, stage)
            self._stage = None
            call.end(self.state)

    def _run_stage(
        self,
        stage: str,
        model: Module,
        sources: DataSources,
        ckpt_path: str | Path | None,
        hooks: Hooks,
        verbose: bool,
        keep_predictions: bool,
    ) -> Any:
        self.fit_loop.progress.pending = None
        self._data = sources
        self._setup_model(model, stage)
        loops = {"validate": self.validate_loop, "test": self.test_loop, "predict": self.predict_loop}
        loop = loops.get(stage)
        checkpoint, self.ckpt_path = None, None  # loaded before the loaders are built, as Lightning
        if ckpt_path is not None:  # (on_load_checkpoint first; resuming fit, on_fit_start runs in the load)
            started = functools.partial(start_fit, self, hooks)
            checkpoint, self.ckpt_path = self.checkpoint_manager.load(
                ckpt_path, stage, self._ckpt_options, started
            )
        log_run_start(self, model, sources.datamodule)  # every call, as Lightning: hparams, graph, save
        if loop is not None:
            loop.setup_data(model, sources)
            results = loop.run(hooks, keep_predictions=stage == "predict" and keep_predictions)
            if verbose and self.is_global_zero and any(results) and stage != "predict":
                self.print(format_results(stage, results))
            finalize_loggers(self, "success")
            return loop.predictions if stage == "predict" else results
        if checkpoint is None:
            start_fit(self, hooks)
        self.fit_loop.run(model, sources, checkpoint, hooks)
        hooks.call("on_fit_end")
        # fit returns once every checkpoint it started is committed; a failed one raises here
        self.checkpoint_manager.wait()
        self._fitted = True
        if isinstance(self._strategy.launcher, SpawnLauncher):
            # gathering the weights is collective (FSDP): every rank takes part, rank 0 sends them
            self._spawn_state = {k: v.detach().cpu() for k, v in self._strategy.module_state_dict().items()}
        finalize_loggers(self, "success")
        return None

    _fitted = False
    _ckpt_options = LoadOptions()  # how the current call loads its ckpt_path

    def _setup_model(self, model: Module, stage: str) -> None:
        strategy = self._strategy
        set_up_model(model, strategy, stage)
        if stage == "fit":
            self.fit_loop.train_loader = None
            optimizers, self.lr_scheduler_configs = parse_optimizers(model.configure_optimizers(), model)
            self.optimizers = [strategy.setup_optimizer(o) for o in optimizers]

    # -------------------------------------------------------------- spawn launcher protocol
    def _run_and_report(self, *args: Any) -> tuple[Any, dict[str, Any]]:
        """:meth:`_run` in a spawned process; with its value, what rank 0 sends back."""
        value = self._run(*args)
        return value, spawn_report(self, self._spawn_state)

    def _apply_spawn_result(self, result: dict[str, Any]) -> None:
        """Bring the trained weights and counters into the parent process's objects."""
        module = self._module
        if module is not None and result["state_dict"]:
            module.configure_model()
            module.load_state_dict(result["state_dict"])
            self._fitted = True
        apply_spawn_report(self, result)
