"""When the learning-rate schedulers step in ``fit``: Lightning's rules, which count batches in
the epoch and epochs, not optimizer steps ([Note: when schedulers step])."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fullshard.trainer.loops.progress import Progress
    from fullshard.trainer.optimization import Optimization
    from fullshard.trainer.trainer import Trainer


class SchedulerStepping:
    """Steps the Trainer's ``lr_scheduler_configs`` for the fit loop that owns ``progress``."""

    def __init__(self, trainer: Trainer, progress: Progress, optimization: Optimization) -> None:
        self.trainer = trainer
        self.progress = progress
        self.optimization = optimization

    def step(self, interval: str, *, plateau: bool, count: int | None = None) -> None:
        """Step the schedulers of ``interval`` that are (or are not) ``ReduceLROnPlateau``, whose
        frequency divides ``count`` (step interval: the batch's number in its epoch, from 1).

        [Note: when schedulers step]
        As Lightning does (its rules, not the optimizer's step count): a "step" scheduler is due
        at each accumulation boundary whose batch number *in the epoch* (from 1) its frequency
        divides, so with ``accumulate_grad_batches=2`` and ``frequency=2`` it steps at every
        optimizer step, and an epoch starts the count afresh. An "epoch" scheduler is due at the
        epoch's last batch when its frequency divides ``current_epoch + 1``; an epoch cut short
        by ``max_steps`` or a stop request does not step it. ``on_train_batch_start`` returning
        -1 makes that batch the epoch's last: the schedulers due then step, though no optimizer
        did (torch then warns that ``lr_scheduler.step()`` came before ``optimizer.step()``, as
        under Lightning). Plateau ones step after the validation that produces their metric.
        Under manual optimization the module steps them itself.
        """
        trainer = self.trainer
        hook = self.optimization.scheduler_hook
        due = self.progress.epoch + 1 if count is None else count
        for config in trainer.lr_scheduler_configs:
            if config.interval != interval or config.is_plateau != plateau:
                continue
            if due % config.frequency == 0:
                config.step(trainer.callback_metrics, hook)
