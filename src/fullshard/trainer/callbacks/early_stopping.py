"""``EarlyStopping``: stop training when a logged metric stops improving (Lightning 2.x's rules).

When it checks: at the end of each training epoch when validation runs once per epoch
(``val_check_interval=1.0`` and ``check_val_every_n_epoch=1``, the defaults), else after each
validation run; ``check_on_train_epoch_end`` overrides that. It never checks during the sanity
validation, outside ``fit``, or in a ``fast_dev_run``.

Every rank evaluates the metric; the decision to stop is then reduced across ranks (one rank
asking is enough), so all processes leave the loop after the same batch and none waits for the
others in a collective.
"""

from __future__ import annotations

import logging
import math
import numbers
from enum import Enum
from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from fullshard.errors import MisconfigurationError
from fullshard.rank_zero import rank_zero_warn
from fullshard.trainer.callbacks.base import Callback

if TYPE_CHECKING:
    from fullshard.module import Module
    from fullshard.trainer.trainer import Trainer

__all__ = ["EarlyStopping", "EarlyStoppingReason"]

log = logging.getLogger(__name__)


class EarlyStoppingReason(Enum):
    """Why :class:`EarlyStopping` stopped training (:attr:`EarlyStopping.stopping_reason`)."""

    NOT_STOPPED = 0
    STOPPING_THRESHOLD = 1
    DIVERGENCE_THRESHOLD = 2
    PATIENCE_EXHAUSTED = 3
    NON_FINITE_METRIC = 4


class EarlyStopping(Callback):
    """Stop training when the metric ``monitor`` has not improved for ``patience`` checks.

    Args:
        monitor: name of a metric logged with ``self.log``.
        min_delta: an improvement must be larger than this (absolute) amount to count.
        patience: number of checks without improvement after which training stops. A check
            happens once per validation run (or per training epoch), not per epoch in general.
        verbose: log each check's outcome (improvement, stop) at INFO level.
        mode: ``"min"``: lower is better; ``"max"``: higher is better.
        strict: raise when ``monitor`` was not logged; with False the check is skipped.
        check_finite: stop when the metric becomes NaN or infinite.
        stopping_threshold: stop as soon as the metric is better than this value.
        divergence_threshold: stop as soon as the metric is worse than this value.
        check_on_train_epoch_end: check at the end of the training epoch (True) or after
            validation (False); None picks as Lightning does (see the module docstring).
        log_rank_zero_only: with ``verbose``, log on global rank 0 only (else every rank logs,
            prefixed with its rank).

    After training, :attr:`stopped_epoch` is the epoch in which the stop was decided (0 if
    none), :attr:`stopping_reason` an :class:`EarlyStoppingReason` and
    :attr:`stopping_reason_message` the explanation; :attr:`best_score` and :attr:`wait_count`
    are the state of the last check. That state is saved in checkpoints and restored on resume.
    """

    mode_dict = {"min": torch.lt, "max": torch.gt}
    order_dict = {"min": "<", "max": ">"}

    def __init__(
        self,
        monitor: str,
        min_delta: float = 0.0,
        patience: int = 3,
        verbose: bool = False,
        mode: str = "min",
        strict: bool = True,
        check_finite: bool = True,
        stopping_threshold: float | None = None,
        divergence_threshold: float | None = None,
        check_on_train_epoch_end: bool | None = None,
        log_rank_zero_only: bool = False,
    ) -> None:
        _check_arguments(
            monitor=monitor,
            min_delta=min_delta,
            patience=patience,
            mode=mode,
            stopping_threshold=stopping_threshold,
            divergence_threshold=divergence_threshold,
            flags={
                "verbose": verbose,
                "strict": strict,
                "check_finite": check_finite,
                "log_rank_zero_only": log_rank_zero_only,
            },
            check_on_train_epoch_end=check_on_train_epoch_end,
        )
        self.monitor = monitor
        self.patience = patience
        self.verbose = verbose
        self.mode = mode
        self.strict = strict
        self.check_finite = check_finite
        self.stopping_threshold = stopping_threshold
        self.divergence_threshold = divergence_threshold
        self.log_rank_zero_only = log_rank_zero_only
        self._check_on_train_epoch_end = check_on_train_epoch_end
        # Stored with the sign that makes "current - min_delta beats best" the improvement test in
        # both modes (Lightning keeps it signed the same way; the messages show its size).
        self.min_delta = float(min_delta) if mode == "max" else -float(min_delta)
        self.wait_count = 0
        self.stopped_epoch = 0
        self.stopping_reason = EarlyStoppingReason.NOT_STOPPED
        self.stopping_reason_message: str | None = None
        self.best_score = torch.tensor(math.inf if mode == "min" else -math.inf)
        self._fitting = False

    @property
    def monitor_op(self) -> Any:
        """``torch.lt`` in ``"min"`` mode, ``torch.gt`` in ``"max"`` mode."""
        return self.mode_dict[self.mode]

    @property
    @override
    def state_key(self) -> str:
        return f"{type(self).__qualname__}{ {'monitor': self.monitor, 'mode': self.mode}!r}"

    # ----------------------------------------------------------------------------------- hooks
    @override
    def setup(self, trainer: Trainer, pl_module: Module, stage: str) -> None:
        self._fitting = stage == "fit"
        if self._check_on_train_epoch_end is None:
            # Validation several times per epoch, or not every epoch: check after validation.
            self._check_on_train_epoch_end = (
                trainer.val_check_interval == 1.0 and trainer.check_val_every_n_epoch == 1
            )

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: Module) -> None:
        if self._check_on_train_epoch_end and not self._should_skip_check(trainer):
            self._run_early_stopping_check(trainer)

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: Module) -> None:
        if not self._check_on_train_epoch_end and not self._should_skip_check(trainer):
            self._run_early_stopping_check(trainer)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "wait_count": self.wait_count,
            "stopped_epoch": self.stopped_epoch,
            "best_score": self.best_score,
            "patience": self.patience,
            "stopping_reason": self.stopping_reason.value,
            "stopping_reason_message": self.stopping_reason_message,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.wait_count = state_dict["wait_count"]
        self.stopped_epoch = state_dict["stopped_epoch"]
        self.best_score = torch.as_tensor(state_dict["best_score"])
        self.patience = state_dict["patience"]
        self.stopping_reason = EarlyStoppingReason(
            state_dict.get("stopping_reason", EarlyStoppingReason.NOT_STOPPED.value)
        )
        self.stopping_reason_message = state_dict.get("stopping_reason_message")

    # ----------------------------------------------------------------------------------- check
    def _should_skip_check(self, trainer: Trainer) -> bool:
        return not self._fitting or trainer.sanity_checking

    def _validate_condition_metric(self, logs: dict[str, torch.Tensor]) -> bool:
        """True when ``monitor`` was logged; otherwise raise (``strict``) or skip this check."""
        if self.monitor in logs:
            return True
        message = (
            f"EarlyStopping(monitor={self.monitor!r}) cannot find {self.monitor!r} among the logged metrics "
            f"({', '.join(map(repr, logs)) or 'none'}). Log it with self.log({self.monitor!r}, value), or pass "
            "one of those names as `monitor`."
        )
        if self.strict:
            raise RuntimeError(message + " (strict=False skips the check while the metric is missing.)")
        if self.verbose:
            rank_zero_warn(message, RuntimeWarning, stacklevel=2)  # the metrics are the same on every rank
        return False

    def _run_early_stopping_check(self, trainer: Trainer) -> None:
        logs = trainer.callback_metrics
        if trainer.fast_dev_run or not self._validate_condition_metric(logs):
            return
        current = logs[self.monitor].detach().squeeze()
        should_stop, reason = self._evaluate_stopping_criteria(current)
        # One rank asking to stop stops them all, at the same point.
        should_stop = trainer.strategy.reduce_boolean_decision(should_stop, all=False)
        trainer.should_stop = trainer.should_stop or should_stop
        if should_stop:
            self.stopped_epoch = trainer.current_epoch
            self.stopping_reason_message = reason
        if reason and self.verbose:
            self._log_info(trainer, reason, self.log_rank_zero_only)

    def _evaluate_stopping_criteria(self, current: torch.Tensor) -> tuple[bool, str | None]:
        """Apply the rules in Lightning's order: non-finite, stopping threshold, divergence
        threshold, improvement, patience. Returns (stop?, message)."""
        better = self.monitor_op
        best = self.best_score.to(current.device)
        if self.check_finite and not torch.isfinite(current):
            self.stopping_reason = EarlyStoppingReason.NON_FINITE_METRIC
            return True, (
                f"Stopping: {self.monitor} = {current.item()} is not finite (best so far "
                f"{self.best_score.item():.3f})."
            )
        if self.stopping_threshold is not None and better(current, self.stopping_threshold):
            self.stopping_reason = EarlyStoppingReason.STOPPING_THRESHOLD
            return True, (
                f"Stopping: {self.monitor} = {current.item()} reached stopping_threshold="
                f"{self.stopping_threshold} ({self.order_dict[self.mode]} is better)."
            )
        if self.divergence_threshold is not None and better(-current, -self.divergence_threshold):
            self.stopping_reason = EarlyStoppingReason.DIVERGENCE_THRESHOLD
            return True, (
                f"Stopping: {self.monitor} = {current.item()} is past divergence_threshold="
                f"{self.divergence_threshold} ({self.order_dict[self.mode]} is better)."
            )
        if better(current - self.min_delta, best):
            message = self._improvement_message(current)
            self.best_score = current.detach().clone().cpu()
            self.wait_count = 0
            return False, message
        self.wait_count += 1
        if self.wait_count >= self.patience:
            self.stopping_reason = EarlyStoppingReason.PATIENCE_EXHAUSTED
            return True, (
                f"Stopping: {self.monitor} did not improve in the last {self.wait_count} checks "
                f"(patience={self.patience}); best {self.best_score.item():.3f}."
            )
        return False, None

    def _improvement_message(self, current: torch.Tensor) -> str:
        if torch.isfinite(self.best_score):
            gain = abs(self.best_score.item() - current.item())
            return (
                f"{self.monitor} improved by {gain:.3f} (min_delta={abs(self.min_delta)}); new best "
                f"{current.item():.3f}."
            )
        return f"{self.monitor} improved; new best {current.item():.3f}."

    @staticmethod
    def _log_info(trainer: Trainer, message: str, log_rank_zero_only: bool) -> None:
        if trainer.world_size > 1:
            if log_rank_zero_only and trainer.global_rank != 0:
                return
            message = f"[rank: {trainer.global_rank}] {message}"
        log.info(message)


def _check_arguments(
    *,
    monitor: Any,
    min_delta: Any,
    patience: Any,
    mode: Any,
    stopping_threshold: Any,
    divergence_threshold: Any,
    flags: dict[str, Any],
    check_on_train_epoch_end: Any,
) -> None:
    def bad(name: str, value: Any, accepted: str) -> MisconfigurationError:
        return MisconfigurationError(f"EarlyStopping({name}={value!r}) is invalid: {accepted}.")

    def is_number(value: Any) -> bool:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)

    if not isinstance(monitor, str) or not monitor:
        raise bad("monitor", monitor, "pass the name of a logged metric, e.g. monitor='val_loss'")
    if mode not in ("min", "max"):
        raise bad("mode", mode, "use 'min' (lower is better) or 'max' (higher is better)")
    if not is_number(min_delta) or min_delta < 0:
        raise bad("min_delta", min_delta, "use a number >= 0 (the size of an improvement that counts)")
    if isinstance(patience, bool) or not isinstance(patience, int) or patience < 0:
        raise bad("patience", patience, "use an int >= 0 (checks without improvement before stopping)")
    for name, value in (
        ("stopping_threshold", stopping_threshold),
        ("divergence_threshold", divergence_threshold),
    ):
        if value is not None and not is_number(value):
            raise bad(name, value, "use a number, or None to disable it")
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise bad(name, value, "use True or False")
    if check_on_train_epoch_end is not None and not isinstance(check_on_train_epoch_end, bool):
        raise bad(
            "check_on_train_epoch_end",
            check_on_train_epoch_end,
            "use True (check at the end of each training epoch), False (after validation) or None (automatic)",
        )
