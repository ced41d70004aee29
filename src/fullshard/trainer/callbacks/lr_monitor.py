"""``LearningRateMonitor``: log each optimizer's learning rate (and optionally momentum and
weight decay) to the Trainer's loggers, under Lightning 2.x's metric names and at its steps.

[Note: learning-rate metric names]
A scheduler's optimizer is named by the scheduler config's ``name`` when given, else
``lr-<OptimizerClass>``; optimizers without a scheduler come after, named ``lr-<OptimizerClass>``.
The second unnamed optimizer of a class gets ``-1``, the third ``-2``, ... An optimizer with
several parameter groups logs one value per group, ``<name>/<group name>`` where a group has a
``"name"`` entry, else ``<name>/pg1``, ``<name>/pg2``, ...; a single group with a ``"name"``
gives ``<name>/<group name>``. Momentum and weight decay are ``<lr name>-momentum`` and
``<lr name>-weight_decay`` (momentum is ``betas[0]`` for Adam-like optimizers, else the group's
``momentum``, 0 when it has none).

When values are logged (``logging_interval=None``): a scheduler stepped per ``"step"`` is logged
before training steps, every ``log_every_n_steps`` steps; one stepped per ``"epoch"`` at the
start of each epoch; an optimizer without a scheduler at both. ``"step"`` or ``"epoch"`` logs
everything at that one interval. The step number is the Trainer's logger step, on global rank 0.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import torch
from torch.optim import Optimizer
from typing_extensions import override

from fullshard.errors import MisconfigurationError
from fullshard.trainer.callbacks.base import Callback

if TYPE_CHECKING:
    from fullshard.module import Module
    from fullshard.trainer.trainer import Trainer

__all__ = ["LearningRateMonitor"]

_INTERVALS = (None, "step", "epoch")


class LearningRateMonitor(Callback):
    """Log the learning rate of every optimizer (see [Note: learning-rate metric names]).

    Args:
        logging_interval: ``"step"`` or ``"epoch"`` to log every optimizer at that interval;
            None to follow each scheduler's own ``interval``.
        log_momentum: also log momentum (``betas[0]`` for Adam-like optimizers).
        log_weight_decay: also log weight decay.

    Values are also put in ``trainer.callback_metrics`` and kept in :attr:`lrs` (name -> list
    of the values logged). Needs a logger: raises ``MisconfigurationError`` at the start of
    training when the Trainer has none.
    """

    def __init__(
        self,
        logging_interval: str | None = None,
        log_momentum: bool = False,
        log_weight_decay: bool = False,
    ) -> None:
        if logging_interval not in _INTERVALS:
            raise MisconfigurationError(
                f"LearningRateMonitor(logging_interval={logging_interval!r}) is invalid: use 'step', 'epoch', or "
                "None (each scheduler's own interval)."
            )
        for name, value in (("log_momentum", log_momentum), ("log_weight_decay", log_weight_decay)):
            if not isinstance(value, bool):
                raise MisconfigurationError(
                    f"LearningRateMonitor({name}={value!r}) is invalid: use True or False."
                )
        self.logging_interval = logging_interval
        self.log_momentum = log_momentum
        self.log_weight_decay = log_weight_decay
        self.lrs: dict[str, list[float]] = {}
        self.last_momentum_values: dict[str, float | None] = {}
        self.last_weight_decay_values: dict[str, float | None] = {}

    # ----------------------------------------------------------------------------------- hooks
    @override
    def on_train_start(self, trainer: Trainer, pl_module: Module) -> None:
        if not trainer.loggers:
            raise MisconfigurationError(
                "LearningRateMonitor needs a logger, but the Trainer has none (logger=False). Pass logger=True "
                "(a CSVLogger in default_root_dir) or a Logger instance, or remove the LearningRateMonitor."
            )
        entries = self._named_optimizers(trainer)
        if self.log_momentum and trainer.is_global_zero:
            lacking = [o for o, _, _ in entries if "momentum" not in o.defaults and "betas" not in o.defaults]
            if lacking:
                warnings.warn(
                    f"LearningRateMonitor(log_momentum=True): {', '.join(type(o).__name__ for o in lacking)} "
                    "has no momentum (nor betas); 0 is logged for it.",
                    RuntimeWarning,
                    stacklevel=2,
                )
        names = [name for _, group_names, _ in entries for name in group_names]
        self.lrs = {name: [] for name in names}
        self.last_momentum_values = {f"{name}-momentum": None for name in names}
        self.last_weight_decay_values = {f"{name}-weight_decay": None for name in names}

    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: Module, batch: Any, batch_idx: int) -> None:
        if self.logging_interval == "epoch" or not _logs_this_step(trainer):
            return
        self._log(trainer, self._extract_stats(trainer, "step" if self.logging_interval is None else "any"))

    @override
    def on_train_epoch_start(self, trainer: Trainer, pl_module: Module) -> None:
        if self.logging_interval == "step":
            return
        self._log(trainer, self._extract_stats(trainer, "epoch" if self.logging_interval is None else "any"))

    # ---------------------------------------------------------------------------------- values
    def _log(self, trainer: Trainer, stats: dict[str, float]) -> None:
        # fast_dev_run: Lightning swaps the loggers for a dummy one, so nothing is written.
        if stats and trainer.is_global_zero and not trainer.fast_dev_run:
            for logger in trainer.loggers:
                logger.log_metrics(stats, step=trainer.logger_step)

    def _extract_stats(self, trainer: Trainer, interval: str) -> dict[str, float]:
        """The values due at ``interval`` (``"step"``, ``"epoch"`` or ``"any"``), by metric name."""
        entries = self._named_optimizers(trainer)
        self._track_new_names(entries)
        stats: dict[str, float] = {}
        for optimizer, names, scheduler_interval in entries:
            if scheduler_interval is not None and interval not in (scheduler_interval, "any"):
                continue
            stats.update(self._optimizer_stats(optimizer, names))
        device = trainer.strategy.root_device
        trainer.callback_metrics.update({k: torch.tensor(v, device=device) for k, v in stats.items()})
        return stats

    def _optimizer_stats(self, optimizer: Optimizer, names: list[str]) -> dict[str, float]:
        stats: dict[str, float] = {}
        use_betas = "betas" in optimizer.defaults
        for group, name in zip(optimizer.param_groups, names, strict=True):
            lr = float(group["lr"])
            stats[name] = lr
            self.lrs[name].append(lr)
            if self.log_momentum:
                momentum = float(group["betas"][0] if use_betas else group.get("momentum", 0))
                stats[f"{name}-momentum"] = self.last_momentum_values[f"{name}-momentum"] = momentum
            if self.log_weight_decay:
                decay = float(group.get("weight_decay", 0))
                stats[f"{name}-weight_decay"] = self.last_weight_decay_values[f"{name}-weight_decay"] = decay
        return stats

    def _track_new_names(self, entries: list[tuple[Optimizer, list[str], str | None]]) -> None:
        """Param groups added during training get new names; a single group's history moves to
        ``<name>/pg1`` once a second group appears."""
        for _, names, _ in entries:
            for name in names:
                single = name.replace("/pg1", "")
                if "/pg1" in name and single in self.lrs:
                    self.lrs[name] = self.lrs.pop(single)
                elif name not in self.lrs:
                    self.lrs[name] = []

    # ----------------------------------------------------------------------------------- names
    def _named_optimizers(self, trainer: Trainer) -> list[tuple[Optimizer, list[str], str | None]]:
        """(optimizer, one metric name per param group, its scheduler's interval or None), for the
        schedulers' optimizers first and then the others (see [Note: learning-rate metric names])."""
        counts: defaultdict[type, int] = defaultdict(int)
        seen: list[Optimizer] = []
        entries: list[tuple[Optimizer, list[str], str | None]] = []
        for config in trainer.lr_scheduler_configs:
            optimizer = config.scheduler.optimizer
            name = config.name
            base = name if name is not None else f"lr-{type(optimizer).__name__}"
            seen.append(optimizer)
            entries.append(
                (optimizer, _group_names(optimizer, base, counts, count=name is None), config.interval)
            )
        for optimizer in trainer.optimizers:
            optimizer = getattr(optimizer, "optimizer", optimizer)  # a wrapper around the torch optimizer
            if any(optimizer is s for s in seen):
                continue
            seen.append(optimizer)
            base = f"lr-{type(optimizer).__name__}"
            entries.append((optimizer, _group_names(optimizer, base, counts, count=True), None))
        return entries


def _group_names(
    optimizer: Optimizer, base: str, counts: defaultdict[type, int], *, count: bool
) -> list[str]:
    kind = type(optimizer)
    if count:
        counts[kind] += 1
    groups = optimizer.param_groups
    given = [group.get("name", f"pg{i}") for i, group in enumerate(groups, start=1)]
    duplicated = sorted({n for n in given if given.count(n) > 1})
    if duplicated:
        raise MisconfigurationError(
            f"LearningRateMonitor: the param groups of {base} have the same 'name' {duplicated}. Give each "
            "param group of one optimizer a different 'name' (or none)."
        )
    if counts.get(kind, 0) > 1:
        base = f"{base}-{counts[kind] - 1}"
    if len(groups) > 1:
        return [f"{base}/{n}" for n in given]
    only = groups[0].get("name") if groups else None
    return [f"{base}/{only}" if only else base]


def _logs_this_step(trainer: Trainer) -> bool:
    """Whether step values are sent to the loggers at this batch (Lightning's rule, checked
    before the step runs: the step about to happen is ``logger_step + 1``)."""
    every = trainer.log_every_n_steps
    if every == 0:
        return False
    return (trainer.logger_step + 1) % every == 0 or trainer.should_stop
