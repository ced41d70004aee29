"""``ModelCheckpoint``: save checkpoints during ``fit``, keep the best ``k`` and the last one.

It follows Lightning 2.x: the same arguments, file names, triggers and retention, with the
differences listed in docs/callbacks.md. A checkpoint is whatever ``trainer.save_checkpoint``
writes: one file, or a directory of shards with ``state_dict_type="sharded"``.

[Note: when ModelCheckpoint saves]
A save is triggered by ``every_n_train_steps`` (after the optimizer step, in
``on_train_batch_end``), by ``train_time_interval`` (same place, once that much time passed) or
by ``every_n_epochs`` (at the end of the training epoch, or after validation, see
:meth:`ModelCheckpoint._should_save_on_train_epoch_end`). Nothing is saved during the sanity
validation, outside ``fit``, in a ``fast_dev_run``, or twice at one global step. A step- or
time-triggered save whose ``monitor`` has not been logged yet (a validation metric before the
first validation) is put off: it happens after the next validation when checkpoints are taken
there, else at the next trigger that finds the metric.

[Note: evicted files deleted after the commit]
``trainer.save_checkpoint`` commits a checkpoint atomically. A checkpoint that falls out of the
top ``k`` (or an older ``last``) is deleted only after every checkpoint of the same save event,
``last`` included, has been committed, so an interrupted save never leaves fewer complete
checkpoints than before. Paths still referenced (best, top ``k``, last) are never deleted. With
``FSDP2Strategy(async_save=True)`` the event's last save is still being written when the event
ends: rank 0 deletes once it is committed (the checkpoint manager's ``after_commit``), and never
if it fails.
"""

from __future__ import annotations

import logging
import math
import os
import time
import warnings
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from fullshard.checkpoint.discovery import newest_complete
from fullshard.errors import MisconfigurationError
from fullshard.rank_zero import rank_zero_warn
from fullshard.trainer.callbacks.base import Checkpoint
from fullshard.trainer.callbacks.checkpoint_files import (
    check_arguments,
    default_dirpath,
    fill_template,
    link_or_copy,
    removable,
    remove_once_committed,
    validates_after_epoch,
    write_scores_yaml,
)
from fullshard.trainer.preemption import TrainingPreempted

if TYPE_CHECKING:
    from fullshard.module import Module
    from fullshard.trainer.trainer import Trainer

__all__ = ["ModelCheckpoint"]

log = logging.getLogger(__name__)


class ModelCheckpoint(Checkpoint):
    """Save checkpoints during training (see [Note: when ModelCheckpoint saves]).

    Args:
        dirpath: directory for the checkpoints. Default: ``<log_dir>/checkpoints`` of the first
            logger (``save_dir/name/version_N/checkpoints``), else ``<default_root_dir>/checkpoints``.
        filename: name template without extension; fields are ``{epoch}``, ``{step}`` and any
            logged metric, with an optional format spec: ``"{epoch}-{val_loss:.2f}"``. A field
            whose metric is not logged reads 0. Default ``"{epoch}-{step}"``.
        monitor: metric that ranks checkpoints; None: keep the newest (or all, ``save_top_k=-1``).
        verbose: log each save (and each checkpoint not admitted) at INFO level on rank 0.
        save_last: also write ``last.ckpt`` whenever a checkpoint is saved (True), or make it
            a symbolic link to that checkpoint (``"link"``, no extra write).
        save_top_k: keep the best ``k`` checkpoints (-1: all, 0: none besides ``last``). With
            ``monitor=None`` only -1, 0 and 1 (the newest) are accepted, as in Lightning; to keep
            the ``k`` newest, pass ``monitor="step", mode="max"``.
        save_on_exception: save a checkpoint when ``fit`` raises (single-process runs only).
        save_weights_only: leave optimizer and scheduler states out of the checkpoints.
        mode: ``"min"`` or ``"max"``: which end of ``monitor`` is best.
        auto_insert_metric_name: write fields as ``name=value`` (``"{epoch}"`` -> ``epoch=3``).
        every_n_train_steps: save every this many optimizer steps (0/None: not by steps).
        train_time_interval: save when this much time (a ``datetime.timedelta``) has passed.
        every_n_epochs: save every this many epochs; the default (1) applies when no trigger is
            given. The three triggers exclude each other.
        save_on_train_epoch_end: take epoch checkpoints at the end of the training epoch (True)
            or after validation (False); None decides as Lightning does.
        enable_version_counter: when the file name exists already, append ``-v1``, ``-v2``, ...
            instead of overwriting it.

    After training, :attr:`best_model_path` and :attr:`best_model_score` (a tensor) describe the
    best checkpoint, :attr:`best_k_models` maps each kept path to its score,
    :attr:`kth_best_model_path` is the worst kept one and :attr:`last_model_path` the ``last``.
    """

    CHECKPOINT_JOIN_CHAR = "-"
    CHECKPOINT_EQUALS_CHAR = "="
    CHECKPOINT_NAME_LAST = "last"
    FILE_EXTENSION = ".ckpt"
    STARTING_VERSION = 1

    def __init__(
        self,
        dirpath: str | os.PathLike[str] | None = None,
        filename: str | None = None,
        monitor: str | None = None,
        verbose: bool = False,
        save_last: bool | str | None = None,
        save_top_k: int = 1,
        save_on_exception: bool = False,
        save_weights_only: bool = False,
        mode: str = "min",
        auto_insert_metric_name: bool = True,
        every_n_train_steps: int | None = None,
        train_time_interval: timedelta | None = None,
        every_n_epochs: int | None = None,
        save_on_train_epoch_end: bool | None = None,
        enable_version_counter: bool = True,
    ) -> None:
        check_arguments(
            dirpath=dirpath,
            filename=filename,
            monitor=monitor,
            save_last=save_last,
            save_top_k=save_top_k,
            mode=mode,
            every_n_train_steps=every_n_train_steps,
            train_time_interval=train_time_interval,
            every_n_epochs=every_n_epochs,
            save_on_train_epoch_end=save_on_train_epoch_end,
            flags={
                "verbose": verbose,
                "save_on_exception": save_on_exception,
                "save_weights_only": save_weights_only,
                "auto_insert_metric_name": auto_insert_metric_name,
                "enable_version_counter": enable_version_counter,
            },
        )
        self.dirpath: str | None = (
            os.path.realpath(os.path.expanduser(os.fspath(dirpath))) if dirpath is not None else None
        )
        self.filename = filename
        self.monitor = monitor
        self.verbose = verbose
        self.save_last = save_last
        self.save_top_k = save_top_k
        self.save_on_exception = save_on_exception
        self.save_weights_only = save_weights_only
        self.mode = mode
        self.auto_insert_metric_name = auto_insert_metric_name
        self._save_on_train_epoch_end = save_on_train_epoch_end
        self._enable_version_counter = enable_version_counter
        no_trigger = every_n_train_steps is None and every_n_epochs is None and train_time_interval is None
        self._every_n_epochs: int = 1 if no_trigger else (every_n_epochs or 0)
        self._every_n_train_steps: int = every_n_train_steps or 0
        self._train_time_interval = train_time_interval

        self.best_k_models: dict[str, torch.Tensor] = {}
        self.kth_best_model_path = ""
        self.kth_value = torch.tensor(math.inf if mode == "min" else -math.inf)
        self.best_model_path = ""
        self.best_model_score: torch.Tensor | None = None
        self.current_score: torch.Tensor | None = None
        self.last_model_path = ""
        self._last_global_step_saved = 0  # nothing to save before the first step
        self._last_checkpoint_saved = ""
        self._last_time_checked: float | None = None
        self._defer_save_until_validation = False
        self._fitting = False
        self._validation_has_run = False
        self._to_remove: list[str] = []
        self._warned: set[str] = set()

    @property
    def every_n_epochs(self) -> int:
        """Epochs between checkpoints (0: not by epochs)."""
        return self._every_n_epochs

    @property
    def every_n_train_steps(self) -> int:
        """Optimizer steps between checkpoints (0: not by steps)."""
        return self._every_n_train_steps

    @property
    def train_time_interval(self) -> timedelta | None:
        """Time between checkpoints, or None."""
        return self._train_time_interval

    @property
    @override
    def state_key(self) -> str:
        key = {
            "monitor": self.monitor,
            "mode": self.mode,
            "every_n_train_steps": self._every_n_train_steps,
            "every_n_epochs": self._every_n_epochs,
            "train_time_interval": self._train_time_interval,
        }
        return f"{type(self).__qualname__}{key!r}"

    # ----------------------------------------------------------------------------------- hooks
    @override
    def setup(self, trainer: Trainer, pl_module: Module, stage: str) -> None:
        self._fitting = stage == "fit"
        self._validation_has_run = False
        self._defer_save_until_validation = False
        # Rank 0 decides (a logger's version is picked from what is on its disk) and tells the others.
        chosen = (self.dirpath or default_dirpath(trainer)) if trainer.is_global_zero else ""
        dirpath = trainer.strategy.broadcast(chosen)
        self.dirpath = dirpath
        warn = trainer.is_global_zero and stage == "fit" and self.save_top_k != 0
        if warn and os.path.isdir(dirpath) and os.listdir(dirpath):
            warnings.warn(f"Checkpoint directory {dirpath} exists and is not empty.", stacklevel=2)

    @override
    def on_train_start(self, trainer: Trainer, pl_module: Module) -> None:
        self._last_time_checked = time.monotonic()
        # The state at the step training starts from is saved already (0 steps, or the checkpoint
        # this run resumed from), so the first save is due after a step of this run.
        self._last_global_step_saved = trainer.global_step

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: Module, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        candidates = self._step_save(trainer, manual=not getattr(pl_module, "automatic_optimization", True))
        if candidates is None:
            return
        self._save_topk_checkpoint(trainer, candidates)
        self._save_last_checkpoint(trainer, candidates)
        self._remove_pending(trainer)

    def _step_save(self, trainer: Trainer, manual: bool) -> dict[str, torch.Tensor] | None:
        """The monitor candidates when this batch's end saves (None: it does not, or puts it off).
        Under manual optimization Lightning 2.6.6 reads no ``train_time_interval`` and defers no
        save for a stale metric, and says that the weights saved are those after the update."""
        time_due = False
        if self._train_time_interval is not None and not manual:
            now, last = time.monotonic(), self._last_time_checked
            time_due = last is not None and now - last >= self._train_time_interval.total_seconds()
            time_due = trainer.strategy.broadcast(time_due)  # clocks differ across ranks: rank 0 decides
            if time_due:
                self._last_time_checked = now
        step_due = self._every_n_train_steps >= 1 and trainer.global_step % self._every_n_train_steps == 0
        if not (step_due or time_due) or (manual and self._should_skip_saving_checkpoint(trainer)):
            return None
        candidates = self._monitor_candidates(trainer)
        if self.monitor is not None and (
            self.monitor not in candidates
            # The metric is stale when a validation follows this last batch of the epoch.
            or (
                not manual
                and trainer.is_last_batch
                and not self._should_save_on_train_epoch_end(trainer)
                and validates_after_epoch(trainer)
            )
        ):
            self._defer_save_until_validation = True
            return None
        if self._should_skip_saving_checkpoint(trainer):
            return None
        if manual:
            rank_zero_warn(
                "ModelCheckpoint(every_n_train_steps=...) with manual optimization saves the model as it is"
                " after training_step returned, that is AFTER its optimizer.step() calls. To keep the state"
                " from before an update, copy it in training_step before optimizer.step() (for example"
                " {k: v.detach().clone() for k, v in self.state_dict().items()}) and save it yourself."
            )
        return candidates

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: Module) -> None:
        if self._should_skip_saving_checkpoint(trainer) or not self._should_save_on_train_epoch_end(trainer):
            return
        self._save_epoch_checkpoints(trainer, self._monitor_candidates(trainer))

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: Module) -> None:
        if not trainer.sanity_checking:
            self._validation_has_run = True
        if self._should_skip_saving_checkpoint(trainer) or self._should_save_on_train_epoch_end(trainer):
            return
        candidates = self._monitor_candidates(trainer)
        if self._defer_save_until_validation:
            self._defer_save_until_validation = False
            self._save_topk_checkpoint(trainer, candidates)
            self._save_last_checkpoint(trainer, candidates)
            self._remove_pending(trainer)
            return
        self._save_epoch_checkpoints(trainer, candidates)

    @override
    def on_train_end(self, trainer: Trainer, pl_module: Module) -> None:
        # save_last promises a last checkpoint even when no trigger fired (e.g. stopped by max_steps).
        if (
            self.save_last
            and not self._last_checkpoint_saved
            and not self._should_skip_saving_checkpoint(trainer)
        ):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
            self._remove_pending(trainer)

    @override
    def on_exception(self, trainer: Trainer, pl_module: Module, exception: BaseException) -> None:
        if not self.save_on_exception or not self._fitting or trainer.sanity_checking or trainer.fast_dev_run:
            return
        if isinstance(exception, TrainingPreempted):  # it saved its own checkpoint already
            return
        if self._last_global_step_saved == trainer.global_step:
            return
        if trainer.world_size > 1:
            # Saving is collective: a rank that failed alone would leave the others waiting in it.
            if trainer.is_global_zero:
                warnings.warn(
                    "ModelCheckpoint(save_on_exception=True) saves only in single-process runs; no checkpoint "
                    f"was written for this {type(exception).__name__}.",
                    stacklevel=2,
                )
            return
        candidates = self._monitor_candidates(trainer)
        filepath = self.format_checkpoint_name(candidates)
        self._save_checkpoint(trainer, filepath)
        self._save_last_checkpoint(trainer, candidates)
        log.info(f"{type(exception).__name__} raised ({exception}); saved checkpoint to {filepath}")

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "monitor": self.monitor,
            "best_model_score": self.best_model_score,
            "best_model_path": self.best_model_path,
            "current_score": self.current_score,
            "dirpath": self.dirpath,
            "best_k_models": dict(self.best_k_models),
            "kth_best_model_path": self.kth_best_model_path,
            "kth_value": self.kth_value,
            "last_model_path": self.last_model_path,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved_dir = state_dict.get("dirpath", self.dirpath)
        if saved_dir == self.dirpath:
            self.best_model_score = state_dict["best_model_score"]
            self.kth_best_model_path = state_dict.get("kth_best_model_path", self.kth_best_model_path)
            self.kth_value = state_dict.get("kth_value", self.kth_value)
            self.best_k_models = dict(state_dict.get("best_k_models", self.best_k_models))
            self.last_model_path = state_dict.get("last_model_path", self.last_model_path)
        else:
            rank_zero_warn(
                f"ModelCheckpoint's dirpath changed from {saved_dir!r} (in the checkpoint) to {self.dirpath!r}: "
                "only best_model_path is restored; best_model_score, best_k_models, kth_best_model_path, "
                "kth_value and last_model_path start afresh.",
                stacklevel=2,
            )
        self.best_model_path = state_dict["best_model_path"]

    # ------------------------------------------------------------------------------- decisions
    def _should_skip_saving_checkpoint(self, trainer: Trainer) -> bool:
        return (
            bool(trainer.fast_dev_run)
            or not self._fitting
            or trainer.sanity_checking
            or self._last_global_step_saved == trainer.global_step
        )

    def _should_save_on_train_epoch_end(self, trainer: Trainer) -> bool:
        """Lightning's rule for where epoch checkpoints are taken when not told."""
        if self._save_on_train_epoch_end is not None:
            return self._save_on_train_epoch_end
        if trainer.check_val_every_n_epoch != 1:
            return False  # validation does not run every epoch: save after it
        if sum(trainer.num_val_batches) == 0:
            return True  # no validation: save at the end of the training epoch
        return trainer.val_check_interval == 1.0  # validation several times an epoch: after it

    def _monitor_candidates(self, trainer: Trainer) -> dict[str, torch.Tensor]:
        """The logged metrics, with ``epoch`` and ``step`` as ints (logged values win)."""
        candidates = dict(trainer.callback_metrics)
        epoch, step = candidates.get("epoch"), candidates.get("step")
        candidates["epoch"] = (
            epoch.int() if isinstance(epoch, torch.Tensor) else torch.tensor(trainer.current_epoch)
        )
        candidates["step"] = (
            step.int() if isinstance(step, torch.Tensor) else torch.tensor(trainer.global_step)
        )
        return candidates

    def check_monitor_top_k(self, trainer: Trainer, current: torch.Tensor | None = None) -> bool:
        """Whether a checkpoint scoring ``current`` enters the top ``k`` (all ranks agree)."""
        if current is None:
            return False
        if self.save_top_k == -1 or len(self.best_k_models) < self.save_top_k:
            return True
        better = torch.lt if self.mode == "min" else torch.gt
        decision = bool(better(current.cpu(), self.best_k_models[self.kth_best_model_path]))
        return trainer.strategy.reduce_boolean_decision(decision, all=True)

    # ---------------------------------------------------------------------------------- saving
    def _save_epoch_checkpoints(self, trainer: Trainer, candidates: dict[str, torch.Tensor]) -> None:
        if self._every_n_epochs >= 1 and (trainer.current_epoch + 1) % self._every_n_epochs == 0:
            self._save_topk_checkpoint(trainer, candidates)
        # last follows a checkpoint saved at this step (a "link" is refreshed anyway)
        if self._last_global_step_saved == trainer.global_step or (
            self.save_last == "link" and self._last_checkpoint_saved
        ):
            self._save_last_checkpoint(trainer, candidates)
        self._remove_pending(trainer)

    def _save_topk_checkpoint(self, trainer: Trainer, candidates: dict[str, torch.Tensor]) -> None:
        if self.save_top_k == 0:
            return
        if self.monitor is None:
            self._save_none_monitor_checkpoint(trainer, candidates)
            return
        if self.monitor not in candidates:
            message = (
                f"ModelCheckpoint(monitor={self.monitor!r}) cannot find {self.monitor!r} among the logged metrics "
                f"({', '.join(map(repr, candidates))}). Log it with self.log({self.monitor!r}, value) in "
                "training_step or validation_step, or change `monitor`."
            )
            if self._validation_has_run:
                raise MisconfigurationError(message)
            if trainer.is_global_zero and message not in self._warned:
                self._warned.add(message)
                warnings.warn(message + " No checkpoint is saved until it is logged.", stacklevel=2)
        current = candidates.get(self.monitor)
        if self.check_monitor_top_k(trainer, current):
            assert current is not None
            self._update_best_and_save(current.detach().cpu(), trainer, candidates)
        elif self.verbose and current is not None:
            self._info(
                trainer,
                f"Epoch {int(candidates['epoch'])}, global step {int(candidates['step'])}: {self.monitor!r} "
                f"was not in top {self.save_top_k}",
            )

    def _update_best_and_save(
        self, current: torch.Tensor, trainer: Trainer, candidates: dict[str, torch.Tensor]
    ) -> None:
        k = len(self.best_k_models) + 1 if self.save_top_k == -1 else self.save_top_k
        replaced: str | None = None
        if len(self.best_k_models) == k and k > 0:
            replaced = self.kth_best_model_path
            self.best_k_models.pop(replaced)
        if torch.isnan(current):  # NaN never ranks: keep it as the worst possible score
            current = torch.tensor(math.inf if self.mode == "min" else -math.inf)
        filepath = self._get_metric_interpolated_filepath_name(candidates, trainer, replaced)
        self.current_score = current
        self.best_k_models[filepath] = current
        if len(self.best_k_models) == k:
            worst = max if self.mode == "min" else min
            self.kth_best_model_path = worst(self.best_k_models, key=lambda p: self.best_k_models[p].item())
            self.kth_value = self.best_k_models[self.kth_best_model_path]
        best = min if self.mode == "min" else max
        self.best_model_path = best(self.best_k_models, key=lambda p: self.best_k_models[p].item())
        self.best_model_score = self.best_k_models[self.best_model_path]
        if self.verbose:
            assert self.best_model_score is not None
            self._info(
                trainer,
                f"Epoch {int(candidates['epoch'])}, global step {int(candidates['step'])}: {self.monitor!r} "
                f"reached {current.item():0.5f} (best {self.best_model_score.item():0.5f}), saving model to "
                f"{filepath!r} as top {k}",
            )
        self._save_checkpoint(trainer, filepath)
        if replaced and self._should_remove_checkpoint(trainer, replaced, filepath):
            self._to_remove.append(replaced)

    def _save_none_monitor_checkpoint(self, trainer: Trainer, candidates: dict[str, torch.Tensor]) -> None:
        filepath = self._get_metric_interpolated_filepath_name(candidates, trainer, self.best_model_path)
        previous, self.best_model_path = self.best_model_path, filepath
        self._save_checkpoint(trainer, filepath)
        if self.save_top_k == 1 and previous and self._should_remove_checkpoint(trainer, previous, filepath):
            self._to_remove.append(previous)

    def _save_last_checkpoint(self, trainer: Trainer, candidates: dict[str, torch.Tensor]) -> None:
        if not self.save_last:
            return
        filepath = self.format_checkpoint_name(candidates, self.CHECKPOINT_NAME_LAST)
        if self._enable_version_counter:
            version = self.STARTING_VERSION
            while self.file_exists(filepath, trainer) and filepath != self.last_model_path:
                filepath = self.format_checkpoint_name(candidates, self.CHECKPOINT_NAME_LAST, ver=version)
                version += 1
        previous, self.last_model_path = self.last_model_path, filepath  # set first: it is part of the state
        if self.save_last == "link" and self._last_checkpoint_saved and self.save_top_k != 0:
            self._link_checkpoint(trainer, self._last_checkpoint_saved, filepath)
        else:
            self._save_checkpoint(trainer, filepath)
        if previous and self._should_remove_checkpoint(trainer, previous, filepath):
            self._to_remove.append(previous)

    def _save_checkpoint(self, trainer: Trainer, filepath: str) -> None:
        is_link = os.path.islink(filepath) if trainer.is_global_zero else False
        if trainer.strategy.reduce_boolean_decision(is_link, all=False):
            # A "last" link (of an earlier run, or before save_last changed): write a real checkpoint
            # in its place, not into the checkpoint it points to.
            if trainer.is_global_zero:
                os.unlink(filepath)
            trainer.strategy.barrier("model_checkpoint_unlink")
        trainer.save_checkpoint(filepath, weights_only=self.save_weights_only)
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath

    @staticmethod
    def _link_checkpoint(trainer: Trainer, filepath: str, linkpath: str) -> None:
        """Make ``linkpath`` a relative symbolic link to ``filepath`` (a copy where links fail)."""
        if trainer.is_global_zero and os.path.abspath(filepath) != os.path.abspath(linkpath):
            link_or_copy(filepath, linkpath)
        trainer.strategy.barrier("model_checkpoint_link")

    def _should_remove_checkpoint(self, trainer: Trainer, previous: str, current: str) -> bool:
        """Delete ``previous`` unless it is ``current``, the checkpoint this run resumed from, or
        outside :attr:`dirpath` (not ours)."""
        return removable(previous, current, trainer.ckpt_path, self.dirpath)

    def _remove_pending(self, trainer: Trainer) -> None:
        """Delete what this save event evicted (see [Note: evicted files deleted after the commit])."""
        if not self._to_remove:
            return
        live = {
            self.best_model_path,
            self.last_model_path,
            self._last_checkpoint_saved,
            *self.best_k_models,
        }
        doomed = [p for p in dict.fromkeys(self._to_remove) if p not in live]
        self._to_remove = []
        remove_once_committed(trainer, doomed)

    # ------------------------------------------------------------------------------------ names
    def format_checkpoint_name(
        self,
        metrics: dict[str, Any],
        filename: str | None = None,
        ver: int | None = None,
        prefix: str | None = None,
    ) -> str:
        """The path for a checkpoint with ``metrics`` (``epoch``, ``step``, logged values).

        ``ModelCheckpoint(filename="{epoch}-{val_loss:.2f}")`` gives ``epoch=2-val_loss=0.12.ckpt``
        in :attr:`dirpath`; ``ver=1`` appends ``-v1``.
        """
        template = filename or self.filename or "{epoch}" + self.CHECKPOINT_JOIN_CHAR + "{step}"
        name = fill_template(
            template, metrics, self.CHECKPOINT_EQUALS_CHAR if self.auto_insert_metric_name else None
        )
        if prefix is not None:
            name = self.CHECKPOINT_JOIN_CHAR.join([prefix, name])
        if ver is not None:
            name = self.CHECKPOINT_JOIN_CHAR.join((name, f"v{ver}"))
        name += self.FILE_EXTENSION
        return os.path.join(self.dirpath, name) if self.dirpath else name

    def _get_metric_interpolated_filepath_name(
        self, candidates: dict[str, torch.Tensor], trainer: Trainer, del_filepath: str | None = None
    ) -> str:
        filepath = self.format_checkpoint_name(candidates)
        if self._enable_version_counter:
            version = self.STARTING_VERSION
            while self.file_exists(filepath, trainer) and filepath != del_filepath:
                filepath = self.format_checkpoint_name(candidates, ver=version)
                version += 1
        return filepath

    def file_exists(self, filepath: str | os.PathLike[str], trainer: Trainer) -> bool:
        """Whether ``filepath`` exists, as rank 0 sees it (every rank gets the same answer)."""
        exists = os.path.exists(filepath) if trainer.is_global_zero else False
        return trainer.strategy.reduce_boolean_decision(exists, all=False)

    # ------------------------------------------------------------------------------------ misc
    def to_yaml(self, filepath: str | os.PathLike[str] | None = None) -> None:
        """Write :attr:`best_k_models` (path: score) as YAML, by default to ``dirpath/best_k_models.yaml``."""
        if filepath is None:
            if self.dirpath is None:
                raise MisconfigurationError(
                    "ModelCheckpoint.to_yaml() without a path needs dirpath, which is known once fit() started. "
                    "Pass a path: to_yaml('best_k_models.yaml')."
                )
            filepath = os.path.join(self.dirpath, "best_k_models.yaml")
        write_scores_yaml(filepath, {path: score.item() for path, score in self.best_k_models.items()})

    def newest_checkpoint(self) -> str | None:
        """The newest complete checkpoint in :attr:`dirpath` (for ``fit(ckpt_path="last")``); a
        sharded directory whose save was interrupted is skipped."""
        if self.dirpath is None:
            return None
        return newest_complete(self.dirpath, self.FILE_EXTENSION, self.CHECKPOINT_NAME_LAST)

    def _info(self, trainer: Trainer, message: str) -> None:
        if trainer.is_global_zero:
            log.info(message)
