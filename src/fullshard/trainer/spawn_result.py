"""What a run started by the :class:`~fullshard.launch.SpawnLauncher` sends back to the process
that called ``fit``/``validate``/``test``/``predict``, and how that process takes it in: the
trained weights, the metrics, the step and epoch counters and the best checkpoint's path, so that
its Trainer reads as if it had run the job itself. Rank 0's report is the one that comes back."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from fullshard.checkpoint.manager import best_checkpoint_path

if TYPE_CHECKING:
    from fullshard.trainer.trainer import Trainer


def spawn_report(trainer: Trainer, state_dict: dict[str, torch.Tensor]) -> dict[str, Any]:
    """What a spawned process sends back once its run ended: ``state_dict`` (the trained weights,
    gathered at the end of ``fit``; empty otherwise) with the metrics and counters of ``trainer``."""
    return {
        "state_dict": state_dict,
        "callback_metrics": {k: v.cpu() for k, v in trainer.callback_metrics.items()},
        "logged_metrics": {k: v.cpu() for k, v in trainer.logged_metrics.items()},
        "global_step": trainer.global_step,
        "current_epoch": trainer.current_epoch,
        "best_model_path": best_checkpoint_path(trainer),
        "state": dataclasses.replace(trainer.state),  # FINISHED, as Lightning's parent process reads it
    }


def apply_spawn_report(trainer: Trainer, result: dict[str, Any]) -> None:
    """Bring the metrics, counters and best checkpoint path of :func:`spawn_report` into
    ``trainer`` (the weights, ``result["state_dict"]``, are the Trainer's to load)."""
    trainer.metrics_collector.callback_metrics.update(result["callback_metrics"])
    trainer.metrics_collector.logged_metrics.update(result["logged_metrics"])
    trainer.global_step = result["global_step"]
    trainer.current_epoch = result["current_epoch"]
    trainer.state = result["state"]
    callback = trainer.checkpoint_callback
    if callback is not None and result.get("best_model_path"):
        callback.best_model_path = result["best_model_path"]
