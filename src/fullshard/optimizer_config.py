"""Turning what ``configure_optimizers()`` returns into optimizers and scheduler configs (read by the
Trainer and by the memory planner, which simulates the optimizer a module configures)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim import Optimizer

from fullshard.errors import MisconfigurationError
from fullshard.rank_zero import rank_zero_warn

_INTERVALS = ("step", "epoch")
_ACCEPTED = (
    "an optimizer, a list of optimizers, a dict {'optimizer': opt, 'lr_scheduler': sched_or_config}, "
    "a list of such dicts, or two lists ([optimizers], [schedulers])"
)


@dataclass
class LRSchedulerConfig:
    """A scheduler and when to step it."""

    scheduler: Any
    interval: str = "epoch"
    frequency: int = 1
    monitor: str | None = None
    name: str | None = None
    strict: bool = True
    reduce_on_plateau: bool = False
    # the keys of those three the config dict gave (manual optimization ignores them, with a warning)
    automatic_only_keys: tuple[str, ...] = ()

    @property
    def is_plateau(self) -> bool:
        """Whether the scheduler steps on a metric (``ReduceLROnPlateau``, or a config with
        ``"reduce_on_plateau": True``)."""
        return self.reduce_on_plateau or isinstance(
            self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau
        )

    def step(
        self, metrics: Mapping[str, torch.Tensor], hook: Callable[[Any, Any], None] | None = None
    ) -> None:
        """Step the scheduler; a plateau one gets the value of :attr:`monitor`. ``hook``: the
        module's ``lr_scheduler_step(scheduler, metric)``, which then does the stepping."""
        if self.is_plateau:
            if self.monitor is None or self.monitor not in metrics:
                if self.monitor is not None and not self.strict:
                    rank_zero_warn(
                        f"ReduceLROnPlateau's metric {self.monitor!r} was not logged; the scheduler is not "
                        "stepped this time (strict=False).",
                        RuntimeWarning,  # Lightning's category
                    )
                    return
                raise MisconfigurationError(
                    f"ReduceLROnPlateau needs the metric named by 'monitor' ({self.monitor!r}), which was not "
                    f"logged; logged metrics: {', '.join(sorted(metrics)) or 'none'}. Return "
                    "{'scheduler': sched, 'monitor': '<metric>'} and log that metric."
                )
            if hook is not None:
                hook(self.scheduler, metrics[self.monitor])
            else:
                self.scheduler.step(float(metrics[self.monitor]))
        elif hook is not None:
            hook(self.scheduler, None)
        else:
            self.scheduler.step()


def _scheduler_config(value: Any, monitor: str | None = None) -> LRSchedulerConfig:
    if isinstance(value, Mapping):
        unknown = set(value) - {
            "scheduler",
            "interval",
            "frequency",
            "monitor",
            "name",
            "strict",
            "reduce_on_plateau",
        }
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
        return LRSchedulerConfig(
            value["scheduler"],
            interval,
            frequency,
            value.get("monitor", monitor),
            value.get("name"),
            bool(value.get("strict", True)),
            bool(value.get("reduce_on_plateau", False)),
            tuple(k for k in value if k in ("monitor", "strict", "reduce_on_plateau")),
        )
    if not hasattr(value, "step") or not hasattr(value, "state_dict"):
        raise MisconfigurationError(
            f"lr_scheduler must be a torch LR scheduler or a config dict, got {type(value).__name__}."
        )
    return LRSchedulerConfig(value, monitor=monitor)


def parse_optimizers(config: Any, module: Any = None) -> tuple[list[Optimizer], list[LRSchedulerConfig]]:
    """Normalise the result of ``configure_optimizers()`` (of ``module``, when given: its
    schedulers are checked against it, see :func:`check_schedulers`).

    Raises:
        MisconfigurationError: the result has none of the accepted forms.
    """
    optimizers, schedulers = _parse(config)
    if module is not None:
        check_schedulers(schedulers, module)
    return optimizers, schedulers


_TORCH_SCHEDULERS = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


def check_schedulers(schedulers: list[LRSchedulerConfig], module: Any) -> None:
    """Lightning's checks of the schedulers of ``module``: a scheduler without torch's API
    needs the module's ``lr_scheduler_step`` (automatic optimization); under manual
    optimization the keys that only automatic stepping reads are ignored, with a warning.

    Raises:
        MisconfigurationError: a scheduler is not a torch one and ``lr_scheduler_step`` is not overridden.
    """
    from fullshard.module import Module

    manual = not module.automatic_optimization
    hooked = type(module).lr_scheduler_step is not Module.lr_scheduler_step
    for config in schedulers:
        scheduler = config.scheduler
        if not manual and not hooked and not isinstance(scheduler, _TORCH_SCHEDULERS):
            raise MisconfigurationError(
                f"The LR scheduler {type(scheduler).__name__} does not follow torch's LRScheduler API, so the "
                f"Trainer cannot step it. Override {type(module).__name__}.lr_scheduler_step(scheduler, metric) "
                "to step it (e.g. scheduler.step(epoch=self.current_epoch)), or use a torch.optim.lr_scheduler."
            )
        if manual and config.automatic_only_keys:  # given at all, whatever their values, as Lightning warns
            keys = ", ".join(repr(k) for k in config.automatic_only_keys)
            rank_zero_warn(
                f"The lr_scheduler config of {type(scheduler).__name__} sets {keys}, which manual "
                "optimization ignores: call scheduler.step() yourself in training_step (or on_train_epoch_end).",
                RuntimeWarning,
            )


def _parse(config: Any) -> tuple[list[Optimizer], list[LRSchedulerConfig]]:
    if config is None:
        raise MisconfigurationError(
            f"configure_optimizers() returned None; the Trainer needs an optimizer. Return {_ACCEPTED}."
        )
    if (
        isinstance(config, list | tuple)
        and len(config) == 2
        and all(isinstance(part, list | tuple) for part in config)
        and all(isinstance(o, Optimizer) for o in config[0])
    ):  # Lightning's two lists: ([optimizers], [schedulers])
        listed = list(config[0])
        if not listed:
            raise MisconfigurationError(f"configure_optimizers() returned no optimizer; return {_ACCEPTED}.")
        return listed, [_scheduler_config(s) for s in config[1]]
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
                schedulers.append(_scheduler_config(entry["lr_scheduler"], entry.get("monitor")))
        else:
            raise MisconfigurationError(
                f"configure_optimizers() returned {type(config).__name__} holding {type(entry).__name__}; "
                f"return {_ACCEPTED}."
            )
    return optimizers, schedulers
