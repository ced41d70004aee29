"""Turning what ``configure_optimizers()`` returns into optimizers and scheduler configs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim import Optimizer

from fullshard.errors import MisconfigurationError

_INTERVALS = ("step", "epoch")
_ACCEPTED = (
    "an optimizer, a list of optimizers, a dict {'optimizer': opt, 'lr_scheduler': sched_or_config}, "
    "or a list of such dicts"
)


@dataclass
class LRSchedulerConfig:
    """A scheduler and when to step it."""

    scheduler: Any
    interval: str = "epoch"
    frequency: int = 1
    monitor: str | None = None

    def step(self, metrics: Mapping[str, torch.Tensor]) -> None:
        """Step the scheduler; ``ReduceLROnPlateau`` gets the value of :attr:`monitor`."""
        if isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            if self.monitor is None or self.monitor not in metrics:
                raise MisconfigurationError(
                    f"ReduceLROnPlateau needs the metric named by 'monitor' ({self.monitor!r}), which was not "
                    f"logged; logged metrics: {', '.join(sorted(metrics)) or 'none'}. Return "
                    "{'scheduler': sched, 'monitor': '<metric>'} and log that metric."
                )
            self.scheduler.step(float(metrics[self.monitor]))
        else:
            self.scheduler.step()


def _scheduler_config(value: Any) -> LRSchedulerConfig:
    if isinstance(value, Mapping):
        unknown = set(value) - {"scheduler", "interval", "frequency", "monitor", "name"}
        if "scheduler" not in value or unknown:
            raise MisconfigurationError(
                f"An lr_scheduler config must be a dict with a 'scheduler' and optionally 'interval', "
                f"'frequency', 'monitor'; got keys {sorted(value)}."
            )
        interval = value.get("interval", "epoch")
        if interval not in _INTERVALS:
            raise MisconfigurationError(
                f"lr_scheduler 'interval' is {interval!r}; use 'step' (after every optimizer step) or 'epoch'."
            )
        frequency = value.get("frequency", 1)
        if not isinstance(frequency, int) or frequency < 1:
            raise MisconfigurationError(f"lr_scheduler 'frequency' must be an int >= 1, got {frequency!r}.")
        return LRSchedulerConfig(value["scheduler"], interval, frequency, value.get("monitor"))
    if not hasattr(value, "step") or not hasattr(value, "state_dict"):
        raise MisconfigurationError(
            f"lr_scheduler must be a torch LR scheduler or a config dict, got {type(value).__name__}."
        )
    return LRSchedulerConfig(value)


def parse_optimizers(config: Any) -> tuple[list[Optimizer], list[LRSchedulerConfig]]:
    """Normalise the result of ``configure_optimizers()``.

    Raises:
        MisconfigurationError: the result has none of the accepted forms.
    """
    entries: Sequence[Any] = config if isinstance(config, list | tuple) else [config]
    if not entries:
        raise MisconfigurationError(
            f"configure_optimizers() returned an empty {type(config).__name__}; return {_ACCEPTED}."
        )
    optimizers: list[Optimizer] = []
    schedulers: list[LRSchedulerConfig] = []
    for entry in entries:
        if isinstance(entry, Optimizer):
            optimizers.append(entry)
        elif isinstance(entry, Mapping) and isinstance(entry.get("optimizer"), Optimizer):
            optimizers.append(entry["optimizer"])
            if entry.get("lr_scheduler") is not None:
                schedulers.append(_scheduler_config(entry["lr_scheduler"]))
        else:
            raise MisconfigurationError(
                f"configure_optimizers() returned {type(config).__name__} holding {type(entry).__name__}; "
                f"return {_ACCEPTED}."
            )
    return optimizers, schedulers
