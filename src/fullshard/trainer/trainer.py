"""The Trainer: the host that drives a Strategy through fit and validate."""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch.optim import Optimizer

from fullshard.errors import MisconfigurationError
from fullshard.launch import ClusterEnvironment, SpawnLauncher, select_cluster_environment
from fullshard.module import Module
from fullshard.seed import current_seed
from fullshard.strategies import STRATEGY_REGISTRY, DDPStrategy, SingleDeviceStrategy, Strategy
from fullshard.trainer import checkpointing, loops
from fullshard.trainer.callbacks import Callback
from fullshard.trainer.data import PreparedLoader, limit_batches, prepare_dataloader
from fullshard.trainer.loggers import CSVLogger, Logger
from fullshard.trainer.metrics import MetricsCollector
from fullshard.trainer.model_checkpoint import ModelCheckpoint, commit_time
from fullshard.trainer.optimizers import LRSchedulerConfig, parse_optimizers
from fullshard.trainer.progress import ProgressBar

_ACCELERATORS = ("auto", "cpu", "cuda", "gpu")
_HOOKS = [name for name in vars(Callback) if name.startswith("on_")]


def _resolve_accelerator(accelerator: str) -> str:
    if accelerator not in _ACCELERATORS:
        raise MisconfigurationError(
            f"accelerator={accelerator!r} is not supported. Use one of {', '.join(map(repr, _ACCELERATORS))}."
        )
    if accelerator == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if accelerator in ("cuda", "gpu"):
        if not torch.cuda.is_available():
            raise MisconfigurationError(
                f"accelerator={accelerator!r} was requested but torch sees no CUDA device "
                f"(torch {torch.__version__}). Use accelerator='cpu', or install a CUDA build of torch."
            )
        return "cuda"
    return "cpu"


def _resolve_devices(
    devices: Any, accelerator: str, env: ClusterEnvironment, num_nodes: int
) -> list[torch.device]:
    accepted = "'auto', a positive int, -1 (all GPUs), or a list of GPU indices"
    if isinstance(devices, str) and devices not in ("auto", "-1"):
        try:
            devices = int(devices)
        except ValueError:
            raise MisconfigurationError(f"devices={devices!r} is not understood; use {accepted}.") from None
    available = torch.cuda.device_count() if accelerator == "cuda" else None
    if devices == "auto":
        if env.creates_processes_externally and not isinstance(env, _local_environment_type()):
            devices = max(env.world_size() // num_nodes, 1)
        else:
            devices = available if accelerator == "cuda" else 1
    if devices in (-1, "-1"):
        if accelerator != "cuda":
            raise MisconfigurationError(
                "devices=-1 means 'all GPUs' and needs accelerator='cuda'; on CPU pass a count."
            )
        devices = available
    if isinstance(devices, bool) or not isinstance(devices, int | list | tuple):
        raise MisconfigurationError(f"devices={devices!r} is not understood; use {accepted}.")
    if isinstance(devices, int):
        if devices < 1:
            raise MisconfigurationError(f"devices={devices} is invalid; use {accepted}.")
        indices = list(range(devices))
    else:
        indices = list(devices)
        if not indices or not all(isinstance(i, int) and i >= 0 for i in indices):
            raise MisconfigurationError(f"devices={devices!r} is invalid; use {accepted}.")
    if accelerator == "cuda":
        if available is not None and max(indices) >= available:
            raise MisconfigurationError(
                f"devices={devices!r} asks for GPU {max(indices)}, but only {available} GPU(s) are visible."
            )
        return [torch.device("cuda", i) for i in indices]
    return [torch.device("cpu")] * len(indices)


def _local_environment_type() -> type:
    from fullshard.launch import LocalEnvironment

    return LocalEnvironment


class Trainer:
    """Runs training and validation of a :class:`fullshard.Module` with a strategy.

    Args:
        accelerator: ``"auto"``, ``"cpu"`` or ``"cuda"`` (``"gpu"`` is an alias).
        devices: processes per node: ``"auto"``, an int, -1 (all GPUs) or a list of GPU indices.
        num_nodes: number of machines.
        strategy: ``"auto"``, a registered name (``"ddp"``, ``"single_device"``, ...) or a
            :class:`~fullshard.strategies.Strategy` instance.
        precision: ``"32-true"``, ``"16-mixed"``, ``"bf16-mixed"``, ``"16-true"`` or ``"bf16-true"``.
        max_epochs: stop after this many epochs (default 1000 when ``max_steps`` is not set).
        max_steps: stop after this many optimizer steps (-1: no limit).
        limit_train_batches: batches per training epoch: a fraction (float) or a count (int).
        limit_val_batches: batches per validation run: a fraction (float) or a count (int).
        val_check_interval: validate every this fraction of an epoch (float) or number of
            training batches (int).
        accumulate_grad_batches: micro-batches per optimizer step.
        gradient_clip_val: clip gradients to this norm (or value, see ``gradient_clip_algorithm``).
        gradient_clip_algorithm: ``"norm"`` (default) or ``"value"``.
        callbacks: extra :class:`~fullshard.trainer.callbacks.Callback` instances.
        logger: a :class:`~fullshard.trainer.loggers.Logger`, a list of them, True/None for a
            :class:`~fullshard.trainer.loggers.CSVLogger` in ``default_root_dir``, or False.
        log_every_n_steps: send step metrics to the logger every this many optimizer steps.
        default_root_dir: where logs and checkpoints go by default (current directory).
        enable_checkpointing: add a :class:`ModelCheckpoint` (every epoch) when none is given.
        enable_progress_bar: show a progress bar on global rank 0.
    """

    def __init__(
        self,
        *,
        accelerator: str = "auto",
        devices: Any = "auto",
        num_nodes: int = 1,
        strategy: str | Strategy = "auto",
        precision: Any = "32-true",
        max_epochs: int | None = None,
        max_steps: int = -1,
        limit_train_batches: int | float = 1.0,
        limit_val_batches: int | float = 1.0,
        val_check_interval: int | float = 1.0,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str = "norm",
        callbacks: Callback | Iterable[Callback] | None = None,
        logger: Logger | Iterable[Logger] | bool | None = None,
        log_every_n_steps: int = 50,
        default_root_dir: str | Path | None = None,
        enable_checkpointing: bool = True,
        enable_progress_bar: bool = True,
    ) -> None:
        self._check_counts(
            num_nodes=num_nodes,
            accumulate_grad_batches=accumulate_grad_batches,
            log_every_n_steps=log_every_n_steps,
        )
        if max_steps != -1 and (not isinstance(max_steps, int) or max_steps < 0):
            raise MisconfigurationError(
                f"max_steps={max_steps!r} is invalid: use -1 (no limit) or an int >= 0."
            )
        if max_epochs is not None and (not isinstance(max_epochs, int) or max_epochs < -1):
            raise MisconfigurationError(
                f"max_epochs={max_epochs!r} is invalid: use -1 (no limit) or an int >= 0."
            )
        if gradient_clip_algorithm not in ("norm", "value"):
            raise MisconfigurationError(
                f"gradient_clip_algorithm={gradient_clip_algorithm!r} is invalid: use 'norm' or 'value'."
            )
        if gradient_clip_val is not None and (
            not isinstance(gradient_clip_val, int | float) or gradient_clip_val <= 0
        ):
            raise MisconfigurationError(
                f"gradient_clip_val={gradient_clip_val!r} is invalid: use a number > 0 or None."
            )
        if (
            isinstance(val_check_interval, bool)
            or not isinstance(val_check_interval, int | float)
            or val_check_interval <= 0
        ):
            raise MisconfigurationError(
                f"val_check_interval={val_check_interval!r} is invalid: use a fraction of an epoch in (0.0, 1.0] "
                "or a number of training batches (int >= 1)."
            )
        if isinstance(val_check_interval, float) and val_check_interval > 1.0:
            raise MisconfigurationError(
                f"val_check_interval={val_check_interval} is a float above 1.0; a float is a fraction of the epoch. "
                f"For a number of batches pass an int, e.g. val_check_interval={int(val_check_interval)}."
            )
        limit_batches(
            limit_train_batches,
            math.inf if isinstance(limit_train_batches, int) else 1,
            "limit_train_batches",
        )
        limit_batches(
            limit_val_batches, math.inf if isinstance(limit_val_batches, int) else 1, "limit_val_batches"
        )

        self.max_steps = max_steps
        self.max_epochs = max_epochs if max_epochs is not None else (1000 if max_steps == -1 else -1)
        self.limit_train_batches = limit_train_batches
        self.limit_val_batches = limit_val_batches
        self.val_check_interval = val_check_interval
        self.accumulate_grad_batches = accumulate_grad_batches
        self.gradient_clip_val = gradient_clip_val
        self.gradient_clip_algorithm = gradient_clip_algorithm
        self.log_every_n_steps = log_every_n_steps
        self.default_root_dir = str(default_root_dir) if default_root_dir is not None else os.getcwd()

        self._accelerator = _resolve_accelerator(accelerator)
        environment = select_cluster_environment()
        device_list = _resolve_devices(devices, self._accelerator, environment, num_nodes)
        self._strategy = self._resolve_strategy(strategy, len(device_list) * num_nodes)
        self._strategy.configure(
            devices=device_list, num_nodes=num_nodes, cluster_environment=environment, precision=precision
        )

        self.callbacks = self._build_callbacks(callbacks, enable_checkpointing, enable_progress_bar)
        self.loggers = self._build_loggers(logger)

        self.current_epoch = 0
        self.global_step = 0
        self.should_stop = False
        self.batch_idx_start = 0
        self.num_training_batches: int | float = 0
        self.num_val_batches: int | float = 0
        self.optimizers: list[Optimizer] = []
        self.lr_scheduler_configs: list[LRSchedulerConfig] = []
        self._batches_in_epoch = 0
        self._epoch_finished = False
        self._module: Module | None = None
        self._train_loader: PreparedLoader | None = None
        self._val_loader: PreparedLoader | None = None
        self._val_check_batches = 0
        self._metrics = MetricsCollector(self._strategy.all_reduce)
        self._hooks: dict[str, list[Callback]] = {}
        self._spawn_state: dict[str, torch.Tensor] = {}

    # ------------------------------------------------------------------------ construction
    @staticmethod
    def _check_counts(**values: Any) -> None:
        for name, value in values.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise MisconfigurationError(f"{name}={value!r} is invalid: use an int >= 1.")

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
                    "fullshard.Callback."
                )
        if checkpointing and not any(isinstance(cb, ModelCheckpoint) for cb in given):
            given.append(ModelCheckpoint())
        if progress_bar and not any(isinstance(cb, ProgressBar) for cb in given):
            given.insert(0, ProgressBar())
        return given

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
    def model(self) -> Module:
        """The module being trained (unwrapped)."""
        if self._module is None:
            raise RuntimeError("Trainer.model is set once fit() or validate() starts.")
        return self._module

    @property
    def global_rank(self) -> int:
        """Rank of this process among all processes of the job."""
        return self._strategy.global_rank

    @property
    def local_rank(self) -> int:
        """Rank of this process on its node."""
        return self._strategy.local_rank

    @property
    def world_size(self) -> int:
        """Number of processes in the job."""
        return self._strategy.world_size

    @property
    def is_global_zero(self) -> bool:
        """True in the process with global rank 0."""
        return self._strategy.is_global_zero

    @property
    def callback_metrics(self) -> dict[str, torch.Tensor]:
        """The latest value of every logged metric."""
        return self._metrics.callback_metrics

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        """The latest values of the metrics logged with ``prog_bar=True``."""
        return self._metrics.progress_bar_metrics()

    @property
    def logger(self) -> Logger | None:
        """The first logger, if any."""
        return self.loggers[0] if self.loggers else None

    @property
    def checkpoint_callback(self) -> ModelCheckpoint | None:
        """The first :class:`ModelCheckpoint` among the callbacks."""
        return next((cb for cb in self.callbacks if isinstance(cb, ModelCheckpoint)), None)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on global rank 0 only."""
        if self.is_global_zero:
            print(*args, **kwargs)

    # ---------------------------------------------------------------------------- entry points
    def fit(
        self,
        model: Module,
        train_dataloaders: Any,
        val_dataloaders: Any = None,
        ckpt_path: str | Path | None = None,
    ) -> None:
        """Train ``model``; resume from ``ckpt_path`` (a file, or ``"last"``) when given."""
        self._check_module(model)
        self._module = model
        self._launch(self._run, "fit", model, train_dataloaders, val_dataloaders, ckpt_path)

    def validate(
        self, model: Module, dataloaders: Any, ckpt_path: str | Path | None = None
    ) -> list[dict[str, float]]:
        """Run one validation pass; returns ``[metrics]``."""
        self._check_module(model)
        self._module = model
        result = self._launch(self._run, "validate", model, None, dataloaders, ckpt_path)
        return [dict(result or {})]

    def save_checkpoint(self, path: str | Path) -> None:
        """Write a checkpoint of the whole training state to ``path``.

        Every process must call this (it gathers per-rank state); global rank 0 writes the file.
        """
        if self._module is None or self._strategy.module is None:
            raise RuntimeError(
                "save_checkpoint() needs a model that was set up by fit() or validate() first."
            )
        checkpoint = checkpointing.dump_checkpoint(self)
        self._strategy.save_checkpoint(checkpoint, path, self.optimizers)

    @staticmethod
    def _check_module(model: Any) -> None:
        if not isinstance(model, Module):
            raise MisconfigurationError(
                f"Trainer expects a fullshard.Module, got {type(model).__name__}. Subclass fullshard.Module "
                "and define training_step and configure_optimizers."
            )

    def _launch(self, function: Any, *args: Any) -> Any:
        launcher = self._strategy.launcher
        if launcher is None:
            return function(*args)
        return launcher.launch(function, *args, trainer=self)

    # ------------------------------------------------------------------------------- running
    def _run(
        self, stage: str, model: Module, train_loader: Any, val_loader: Any, ckpt_path: str | Path | None
    ) -> dict[str, float] | None:
        strategy = self._strategy
        strategy.setup_environment()
        self._module = model
        model._trainer = self
        self._hooks = {
            name: [cb for cb in self.callbacks if getattr(type(cb), name) is not getattr(Callback, name)]
            for name in _HOOKS
        }
        for cb in self.callbacks:
            cb.setup(self, model, stage)
        try:
            self._setup_model(model, stage)
            self._setup_data(train_loader, val_loader)
            checkpoint = self._load_checkpoint(ckpt_path, stage) if ckpt_path is not None else None
            if stage == "validate":
                return loops.run_validation(self)
            self._log_hyperparams(model)
            model.on_fit_start()
            self._call("on_fit_start")
            if checkpoint is not None:
                checkpointing.restore_rng_states(self, checkpoint)
            loops.run_fit(self)
            if isinstance(strategy.launcher, SpawnLauncher):
                # gathering the weights is collective (FSDP): every rank takes part, rank 0 sends them
                self._spawn_state = {k: v.detach().cpu() for k, v in strategy.module_state_dict().items()}
            self._finalize_loggers("success")
            return None
        except BaseException as exception:
            strategy.on_exception(exception)
            for cb in self.callbacks:
                cb.on_exception(self, model, exception)
            self._finalize_loggers("failed")
            raise
        finally:
            for cb in self.callbacks:
                cb.teardown(self, model, stage)

    def _setup_model(self, model: Module, stage: str) -> None:
        strategy = self._strategy
        with strategy.tensor_init_context(), strategy.model_sharded_context():
            model.configure_model()
        strategy.setup_module(model)
        if stage == "fit":
            optimizers, self.lr_scheduler_configs = parse_optimizers(model.configure_optimizers())
            self.optimizers = [strategy.setup_optimizer(o) for o in optimizers]

    def _setup_data(self, train_loader: Any, val_loader: Any) -> None:
        strategy = self._strategy
        sampler_kwargs = strategy.distributed_sampler_kwargs
        seed = current_seed()
        self._train_loader = self._val_loader = None
        self.num_training_batches = self.num_val_batches = 0
        if train_loader is not None:
            self._train_loader = prepare_dataloader(
                train_loader, shuffle_default=True, seed=seed, name="train_dataloaders", **sampler_kwargs
            )
            available = len(self._train_loader) if self._train_loader.has_len() else math.inf
            self.num_training_batches = limit_batches(
                self.limit_train_batches, available, "limit_train_batches"
            )
            if self.num_training_batches == 0:
                warnings.warn(
                    "The training dataloader yields no batches (or limit_train_batches=0): nothing to train.",
                    stacklevel=3,
                )
        if val_loader is not None:
            self._val_loader = prepare_dataloader(
                val_loader, shuffle_default=False, seed=seed, name="val_dataloaders", **sampler_kwargs
            )
            available = len(self._val_loader) if self._val_loader.has_len() else math.inf
            self.num_val_batches = limit_batches(self.limit_val_batches, available, "limit_val_batches")
        self._val_check_batches = self._compute_val_check_batches()

    def _compute_val_check_batches(self) -> int:
        if self._val_loader is None or self.num_val_batches == 0:
            return 0
        if isinstance(self.val_check_interval, int):
            return self.val_check_interval
        if math.isinf(self.num_training_batches):
            if self.val_check_interval == 1.0:
                return 0  # validated at the end of each epoch instead
            raise MisconfigurationError(
                "val_check_interval is a fraction, but the training dataloader has no length. Pass a number "
                "of batches instead, e.g. val_check_interval=1000."
            )
        return max(1, int(self.num_training_batches * self.val_check_interval))

    def _load_checkpoint(self, ckpt_path: str | Path, stage: str) -> dict[str, Any] | None:
        path = self._resolve_ckpt_path(ckpt_path)
        if path is None:
            return None
        if stage == "validate":
            return self._strategy.load_checkpoint(path, weights_only=True)
        checkpoint = self._strategy.load_checkpoint(
            path, self.optimizers, check=checkpointing.scheduler_check(self, path)
        )
        checkpointing.restore_checkpoint(self, checkpoint)
        return checkpoint

    def _resolve_ckpt_path(self, ckpt_path: str | Path) -> str | None:
        if str(ckpt_path) != "last":
            return str(ckpt_path)
        candidates = [cb.newest_checkpoint() for cb in self.callbacks if isinstance(cb, ModelCheckpoint)]
        found = [c for c in candidates if c is not None]
        if not found:
            warnings.warn(
                "fit(ckpt_path='last') found no checkpoint in the ModelCheckpoint directories; training starts "
                "from scratch.",
                stacklevel=4,
            )
            return None
        return max(found, key=lambda p: commit_time(Path(p)))

    # ----------------------------------------------------------------- helpers for the loops
    def _call(self, hook: str) -> None:
        module = self.model
        for cb in self._hooks.get(hook, ()):
            getattr(cb, hook)(self, module)

    def _done(self) -> bool:
        if self.should_stop or self.num_training_batches == 0:
            return True
        if self.max_steps >= 0 and self.global_step >= self.max_steps:
            return True
        return self.max_epochs >= 0 and self.current_epoch >= self.max_epochs

    def _is_optimizer_step_boundary(self) -> bool:
        """True right after an optimizer step (no gradients are being accumulated)."""
        n = self._batches_in_epoch
        return n % self.accumulate_grad_batches == 0 or n == self.num_training_batches

    def _loop_state(self) -> dict[str, Any]:
        return {
            "epoch": self.current_epoch,
            "global_step": self.global_step,
            "batches_in_epoch": self._batches_in_epoch,
            "epoch_finished": self._epoch_finished,
        }

    def _restore_loop_state(self, state: dict[str, Any]) -> None:
        self.global_step = int(state["global_step"])
        self.current_epoch = int(state["epoch"])
        self._batches_in_epoch = int(state["batches_in_epoch"])
        if state.get("epoch_finished"):
            self.current_epoch += 1
            self._batches_in_epoch = 0
        self._epoch_finished = False

    def _log_metrics(self, values: dict[str, float]) -> None:
        if self.is_global_zero:
            values = {**values, "epoch": float(self.current_epoch)}
            for logger in self.loggers:
                logger.log_metrics(values, step=self.global_step)

    def _log_hyperparams(self, model: Module) -> None:
        if self.is_global_zero and model.hparams:
            for logger in self.loggers:
                logger.log_hyperparams(model.hparams)

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
            "global_step": self.global_step,
            "current_epoch": self.current_epoch,
        }

    def _apply_spawn_result(self, result: dict[str, Any]) -> None:
        """Bring the trained weights and counters into the parent process's objects."""
        module = self._module
        if module is not None and result["state_dict"]:
            module.configure_model()
            module.load_state_dict(result["state_dict"])
        self._metrics.callback_metrics.update(result["callback_metrics"])
        self.global_step = result["global_step"]
        self.current_epoch = result["current_epoch"]
