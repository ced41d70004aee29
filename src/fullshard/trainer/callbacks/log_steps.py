"""When a callback that logs per batch (``ThroughputMonitor``, ``DeviceStatsMonitor``) sends its
values to the loggers: Lightning's ``should_update_logs`` rule."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fullshard.trainer.trainer import Trainer


def logs_due(trainer: Trainer, eval_batch_idx: int | None = None) -> bool:
    """Whether values logged now reach the loggers: every ``log_every_n_steps`` optimizer steps
    in training (counting the step about to be taken), every ``log_every_n_steps`` batches of an
    evaluation run (``eval_batch_idx``, from 0), and when training is stopping."""
    every = trainer.log_every_n_steps
    if every == 0:
        return False
    count = trainer.fit_loop.progress.batches_that_stepped if eval_batch_idx is None else eval_batch_idx
    return (count + 1) % every == 0 or trainer.should_stop
