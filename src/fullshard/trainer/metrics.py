"""What ``Module.log`` records: step values, epoch reductions, and where each one goes.

[Note: when logged values become visible]
As in Lightning: a value logged with ``on_step`` is in ``callback_metrics`` at once and reaches
the loggers after the optimizer step, every ``log_every_n_steps`` steps. Values logged with
``on_epoch`` inside a step are accumulated (a mean weights each batch by its size) and reduced
when the epoch ends, *before* the epoch-end hooks run, so callbacks see them there. Values
logged inside an epoch-end hook are epoch values already. Everything an epoch produced is sent
to the loggers in one row after the epoch-end hooks, so what ``on_validation_epoch_end`` logs
reaches ``ModelCheckpoint``/``EarlyStopping`` (which act in ``on_validation_end``) and the
loggers of the same validation run.

[Note: committed metrics]
Lightning keeps what a step or an epoch-end logs apart until that batch (after its
``on_*_batch_end`` hooks), evaluation dataloader or epoch end (after its ``on_*_epoch_end`` hooks)
is over, or until ``trainer.callback_metrics``/``trainer.logged_metrics`` is read: only then does
the value stay visible once a call fails. So a value a failing hook logged, which nobody read,
is absent from both after the exception, and one a callback read (``EarlyStopping`` reading
``callback_metrics`` before it raises) is in ``callback_metrics`` but not in ``logged_metrics``.
The collector keeps such values "fresh" until :meth:`MetricsCollector.commit` (or a read of the
property) and drops the fresh ones when the call fails.

[Note: torchmetrics]
A ``torchmetrics.Metric`` given to ``log`` is not turned into a number: the collector keeps the
object. Its step value is what its last ``forward`` returned (the batch's value); its epoch value
is its ``compute()`` over everything it was updated with, taken where the epoch's values are
reduced, and it is ``reset()`` once the epoch's values went to the loggers (as in Lightning). The
metric synchronizes its own states across processes in ``compute()`` (its ``dist_sync_*``
options): the collector never reduces it (``sync_dist`` is ignored). torchmetrics is optional:
a Metric is recognized through ``sys.modules``, so fullshard never imports it.
"""

from __future__ import annotations

import numbers
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import torch

from fullshard.errors import MisconfigurationError
from fullshard.rank_zero import PossibleUserWarning, rank_zero_warn_once
from fullshard.strategies.strategy import ReduceOp

_REDUCE_FX: tuple[ReduceOp, ...] = ("mean", "sum", "max", "min")
Snapshot = tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], set[str], dict[str, torch.Tensor]]
STAGES = ("train", "validate", "test", "predict")


@dataclass
class _EpochAccumulator:
    reduce_fx: ReduceOp
    sync_dist: bool
    prog_bar: bool
    logger: bool
    base: str | None  # logged with on_step too: the key has "_epoch" and this name also gets the value
    value: torch.Tensor | None = None
    weight: float = 0.0
    metric: Any = None  # a torchmetrics.Metric: its compute() is the epoch value

    def update(self, value: torch.Tensor, weight: float) -> None:
        if self.value is None:
            self.value = value * weight if self.reduce_fx == "mean" else value.clone()
        elif self.reduce_fx == "mean":
            self.value = self.value + value * weight
        elif self.reduce_fx == "sum":
            self.value = self.value + value
        elif self.reduce_fx == "max":
            self.value = torch.maximum(self.value, value)
        else:
            self.value = torch.minimum(self.value, value)
        self.weight += weight


# the callables Lightning takes for each reduction (the builtins too)
_REDUCE_CALLABLES: tuple[tuple[Any, ReduceOp], ...] = (
    (torch.mean, "mean"),
    (torch.sum, "sum"),
    (sum, "sum"),
    (torch.max, "max"),
    (max, "max"),
    (torch.min, "min"),
    (min, "min"),
)


def parse_reduce_fx(name: str, reduce_fx: Any) -> ReduceOp:
    """``log(reduce_fx=...)`` as one of the four reductions, as Lightning reads it: a name
    (any case; ``"avg"`` is ``"mean"``) or ``torch.mean``/``torch.sum``/``torch.max``/``torch.min``
    (or the builtins ``sum``, ``max``, ``min``)."""
    if isinstance(reduce_fx, str):
        lowered = reduce_fx.lower()
        lowered = "mean" if lowered == "avg" else lowered
        if lowered in _REDUCE_FX:
            return lowered  # type: ignore[return-value]
    else:
        for function, op in _REDUCE_CALLABLES:
            if reduce_fx is function:
                return op
    raise MisconfigurationError(
        f"log({name!r}, reduce_fx={reduce_fx!r}): reduce_fx must be min, max, mean or sum (a name, or torch.min, "
        "torch.max, torch.mean, torch.sum). For another reduction, log a torchmetrics.Metric that computes it."
    )


def is_metric(value: Any) -> bool:
    """Whether ``value`` is a ``torchmetrics.Metric`` (without importing torchmetrics)."""
    torchmetrics = sys.modules.get("torchmetrics")
    return torchmetrics is not None and isinstance(value, torchmetrics.Metric)


def extract_batch_size(batch: Any) -> int | None:
    """The size of a batch as Lightning infers it: the first dimension of the first tensor found
    (depth first through mappings and sequences); None when the batch holds no tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.size(0)) if batch.ndim else 1
    if isinstance(batch, str | bytes):
        return None
    if isinstance(batch, Mapping):
        batch = batch.values()
    if isinstance(batch, Iterable):
        for item in batch:
            size = extract_batch_size(item)
            if size is not None:
                return size
    return None


def _warn_unsynced_epoch_value(key: str) -> None:
    """An epoch value logged without ``sync_dist`` on several processes is this process's alone
    (said once per logged name, whichever evaluation dataloaders it was logged for)."""
    name = re.sub(r"/dataloader_idx_\d+$", "", key)
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if distributed and torch.distributed.get_world_size() > 1:
        rank_zero_warn_once(
            f"self.log({name!r}, ...) on epoch level without sync_dist=True gives each process the "
            "value of its own batches only. Pass sync_dist=True to reduce it across processes "
            "(as a monitored or compared metric usually needs).",
            category=PossibleUserWarning,
        )


class MetricsCollector:
    """Collects values from ``Module.log`` and reduces them per step and per epoch.

    Args:
        all_reduce: the strategy's ``all_reduce`` (for ``sync_dist=True``).
    """

    def __init__(self, all_reduce: Callable[[torch.Tensor, ReduceOp], torch.Tensor]) -> None:
        self._all_reduce = all_reduce
        self.stage = "train"
        self.in_step = True  # False while an epoch-level hook runs
        # [Note: committed metrics]
        self._callback: dict[str, torch.Tensor] = {}
        self._logged: dict[str, torch.Tensor] = {}
        self._fresh_callback: dict[str, torch.Tensor] = {}
        self._fresh_logged: dict[str, torch.Tensor] = {}
        self._prog_bar: set[str] = set()
        # step values of validation/test/predict: Lightning keeps them out of callback_metrics
        # (monitors see epoch values only there) but shows them in the progress bar
        self._eval_step_values: dict[str, torch.Tensor] = {}
        self._pending_step: dict[str, dict[str, torch.Tensor]] = {stage: {} for stage in STAGES}
        self._pending_epoch: dict[str, torch.Tensor] = {}
        self._epoch: dict[str, dict[str, _EpochAccumulator]] = {stage: {} for stage in STAGES}
        self._published: set[str] = set()
        self._batch: Any = None
        self._batch_size: int | None = None
        self.dataloader_idx: int | None = None  # set while the steps of one of several loaders run
        self._loader_of_name: dict[str, int] = {}  # names logged without the suffix, by loader
        # the torchmetrics each stage logged: reset once its epoch's values were logged
        self._metric_objects: dict[str, list[Any]] = {stage: [] for stage in STAGES}

    @property
    def callback_metrics(self) -> dict[str, torch.Tensor]:
        """``trainer.callback_metrics``: reading it takes in what the running step or epoch-end
        logged so far ([Note: committed metrics])."""
        self._callback.update(self._fresh_callback)
        self._fresh_callback.clear()
        return self._callback

    @property
    def logged_metrics(self) -> dict[str, torch.Tensor]:
        """``trainer.logged_metrics``, read as :attr:`callback_metrics` is."""
        self._logged.update(self._fresh_logged)
        self._fresh_logged.clear()
        return self._logged

    def _visible_callback(self) -> dict[str, torch.Tensor]:
        return {**self._callback, **self._fresh_callback}

    def commit(self) -> None:
        """A batch or an epoch's end is over: what it logged stays visible after a failure."""
        self._callback.update(self._fresh_callback)
        self._logged.update(self._fresh_logged)
        self._fresh_callback.clear()
        self._fresh_logged.clear()

    def drop_uncommitted(self) -> None:
        """The call failed: forget what was logged since the last commit and never read
        ([Note: committed metrics])."""
        self._fresh_callback.clear()
        self._fresh_logged.clear()

    def set_batch(self, batch: Any) -> None:
        """The batch being processed (its size weights epoch means); the previous batch is over,
        so what it logged is committed."""
        self.commit()
        self._batch = batch
        self._batch_size = None

    def _current_batch_size(self) -> int:
        if self._batch_size is None:
            self._batch_size = extract_batch_size(self._batch) or 1
        return self._batch_size

    def log(
        self,
        name: str,
        value: Any,
        *,
        prog_bar: bool,
        sync_dist: bool,
        on_step: bool | None,
        on_epoch: bool | None,
        reduce_fx: str | Callable[..., Any],
        batch_size: int | None,
        logger: bool,
        add_dataloader_idx: bool = True,
    ) -> None:
        """Record one value; see :meth:`fullshard.Module.log` for the arguments."""
        reduce = parse_reduce_fx(name, reduce_fx)
        in_step = self.in_step
        # Lightning's defaults, each on its own: the training steps and batch hooks log per step,
        # everything else per epoch; on_step=True in validation_step keeps the epoch value too
        step_level = in_step and self.stage == "train"
        if on_step is None:
            on_step = step_level
        if on_epoch is None:
            on_epoch = not step_level
        if (on_step and not in_step) or not (on_step or on_epoch):
            _refuse_levels(name, on_step)
        # one of several evaluation loaders: Lightning appends this after "_step"/"_epoch"
        idx = self.dataloader_idx
        suffix = f"/dataloader_idx_{idx}" if add_dataloader_idx and in_step and idx is not None else ""
        if not add_dataloader_idx and in_step and idx is not None:
            self._check_one_loader(name, idx)
        metric = value if is_metric(value) else None
        if metric is not None:  # [Note: torchmetrics]
            tensor, sync_dist = self._track_metric(name, metric, on_step), False
        else:
            tensor = self._to_tensor(name, value)
        if on_step and tensor is not None:
            step_value = self._all_reduce(tensor, reduce) if sync_dist else tensor
            key = f"{name}_step{suffix}" if on_epoch else f"{name}{suffix}"
            if self.stage == "train":
                self._fresh_callback[key] = step_value
                if on_epoch:
                    self._fresh_callback[f"{name}{suffix}"] = step_value
            else:
                self._eval_step_values[key] = step_value
            if prog_bar:
                self._prog_bar.add(key)
            if logger:
                self._pending_step[self.stage][key] = step_value
                self._fresh_logged[key] = step_value
        if not on_epoch:
            return
        key = f"{name}_epoch{suffix}" if on_step else f"{name}{suffix}"
        base = f"{name}{suffix}" if on_step else None
        if metric is not None:
            if not in_step:  # an epoch-end hook: its value over the epoch, now
                self._publish_epoch_value(key, self._compute(name, metric), prog_bar, logger, base)
            else:
                self._epoch[self.stage][key] = _EpochAccumulator(
                    reduce, False, prog_bar, logger, base, metric=metric
                )
            return
        assert tensor is not None
        if not in_step:  # an epoch-end hook: this is the epoch's value already
            if sync_dist:
                tensor = self._all_reduce(tensor, reduce)
            else:
                _warn_unsynced_epoch_value(key)
            self._publish_epoch_value(key, tensor, prog_bar, logger, base)
            return
        accumulators = self._epoch[self.stage]
        acc = accumulators.get(key)
        if acc is None:
            acc = accumulators[key] = _EpochAccumulator(reduce, sync_dist, prog_bar, logger, base)
        if batch_size is None and reduce == "mean":
            batch_size = self._current_batch_size()
        acc.update(tensor, float(batch_size) if batch_size is not None else 1.0)

    def _track_metric(self, name: str, metric: Any, on_step: bool) -> torch.Tensor | None:
        """Keep a logged torchmetrics object of this stage (once) and return its step value."""
        logged = self._metric_objects[self.stage]
        if all(m is not metric for m in logged):
            logged.append(metric)
        return self._metric_step_value(name, metric, on_step)

    def _publish_epoch_value(
        self, key: str, value: torch.Tensor, prog_bar: bool, logger: bool, base: str | None
    ) -> None:
        self._fresh_callback[key] = value
        if logger:  # Lightning's validate/test results hold what went to the loggers only
            self._published.add(key)
        if base is not None:
            self._fresh_callback[base] = value
        if prog_bar:
            self._prog_bar.add(key)
        if logger:
            self._pending_epoch[key] = value
            self._fresh_logged[key] = value

    def _check_one_loader(self, name: str, idx: int) -> None:
        first = self._loader_of_name.setdefault(name, idx)
        if first != idx:
            raise MisconfigurationError(
                f"log({name!r}, add_dataloader_idx=False) was called from dataloader {first} and dataloader {idx} "
                "of the same run; their values would mix under one name (Lightning refuses it too). Give each "
                f'dataloader its own name, e.g. f"{name}_{{dataloader_idx}}", or drop add_dataloader_idx=False.'
            )

    def start_evaluation(self) -> None:
        """A validation/test/predict run starts: names logged without the dataloader suffix are
        counted from here."""
        self._loader_of_name.clear()

    def _metric_step_value(self, name: str, metric: Any, on_step: bool) -> torch.Tensor | None:
        """The metric's value on the current batch (what its last ``forward`` returned); None
        when only ``update()`` was called, as Lightning then logs no step value."""
        if not on_step:
            return None
        # torchmetrics keeps the last forward's result only in this private attribute (no public
        # API has it); Lightning reads the same one
        cache = getattr(metric, "_forward_cache", None)
        return None if cache is None else self._to_tensor(name, cache)

    def _compute(self, name: str, metric: Any) -> torch.Tensor:
        return self._to_tensor(name, metric.compute())

    @staticmethod
    def _to_tensor(name: str, value: Any) -> torch.Tensor:
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(
                    f"log({name!r}) got a tensor of shape {tuple(value.shape)}; only scalars can be logged. "
                    "Reduce it first (e.g. value.mean())."
                )
            return value.detach().reshape(()).float()
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return torch.tensor(float(value))
        raise TypeError(
            f"log({name!r}) got a {type(value).__name__}; log a number, a one-element tensor or a "
            "torchmetrics.Metric."
        )

    def has_step_log(self) -> bool:
        """Whether the current stage logged step values since the last :meth:`pop_step_log`."""
        return bool(self._pending_step[self.stage])

    def pop_step_log(self) -> dict[str, float]:
        """The step values the current stage logged since the last call, as floats for a logger."""
        pending = self._pending_step[self.stage]
        out = {k: float(v) for k, v in pending.items()}
        pending.clear()
        return out

    def reduce_epoch(self, stage: str) -> None:
        """Finish the accumulated metrics of ``stage``'s epoch (collective when any is
        ``sync_dist``); the results go to ``callback_metrics`` and wait for :meth:`pop_epoch_log`."""
        self.commit()  # the last batch is over
        accumulators = self._epoch[stage]
        for key, acc in accumulators.items():
            if acc.metric is not None:
                value = self._compute(acc.base or key, acc.metric)
                self._publish_epoch_value(key, value, acc.prog_bar, acc.logger, acc.base)
                continue
            if acc.value is None:
                continue
            value, weight = acc.value, torch.tensor(acc.weight)
            if not acc.sync_dist:
                _warn_unsynced_epoch_value(acc.base or key)
            if acc.sync_dist:
                value = self._all_reduce(value, "sum" if acc.reduce_fx in ("mean", "sum") else acc.reduce_fx)
                if acc.reduce_fx == "mean":
                    weight = self._all_reduce(weight, "sum")
            if acc.reduce_fx == "mean":
                value = value / weight
            self._publish_epoch_value(key, value, acc.prog_bar, acc.logger, acc.base)
        accumulators.clear()
        if stage != "train":  # an evaluation dataloader's values are final at once (Lightning's rule)
            self.commit()

    def pop_epoch_log(self) -> dict[str, float]:
        """The epoch values waiting for the loggers, as floats; the torchmetrics the current
        stage logged are reset (its epoch is over)."""
        self.commit()  # the epoch-end hooks are over
        out = {k: float(v) for k, v in self._pending_epoch.items()}
        self._pending_epoch.clear()
        self._reset_metrics(self.stage)
        return out

    def _reset_metrics(self, stage: str) -> None:
        for metric in self._metric_objects[stage]:
            metric.reset()
        self._metric_objects[stage].clear()

    def epoch_results(self) -> dict[str, float]:
        """The epoch values published with ``logger=True`` since the last call (what
        ``validate``/``test`` return: Lightning leaves ``logger=False`` values out)."""
        visible = self._visible_callback()
        out = {k: float(visible[k]) for k in self._published if k in visible}
        self._published.clear()
        return out

    def reset(self) -> None:
        """Forget every value (a new ``fit``/``validate``/``test``/``predict`` call starts)."""
        self.restore(({}, {}, set(), {}))

    def snapshot(self) -> Snapshot:
        """The visible state, to put back with :meth:`restore` (after the sanity validation)."""
        return (
            self._visible_callback(),
            {**self._logged, **self._fresh_logged},
            set(self._prog_bar),
            dict(self._eval_step_values),
        )

    def restore(self, snapshot: Snapshot) -> None:
        """Forget everything logged since :meth:`snapshot` was taken."""
        self._callback = dict(snapshot[0])
        self._logged = dict(snapshot[1])
        self._fresh_callback, self._fresh_logged = {}, {}
        self._prog_bar = set(snapshot[2])
        self._eval_step_values = dict(snapshot[3])
        for pending in self._pending_step.values():
            pending.clear()
        self._pending_epoch.clear()
        for accumulators in self._epoch.values():
            accumulators.clear()
        for stage in STAGES:
            self._reset_metrics(stage)
        self.dataloader_idx = None

    def progress_bar_metrics(self) -> dict[str, float]:
        """The latest values of the metrics logged with ``prog_bar=True``, in the order they were
        logged (the same in every run, as the bar shows them)."""
        values = {**self._eval_step_values, **self._visible_callback()}
        return {k: float(v) for k, v in values.items() if k in self._prog_bar}


def _refuse_levels(name: str, on_step: bool) -> NoReturn:
    """``log(name, on_step=, on_epoch=)`` asked for a level that does not exist here, or none."""
    if on_step:
        raise MisconfigurationError(
            f"log({name!r}, on_step=True) was called in an epoch-level hook, where there is no step. "
            "Use on_step=False (the default there), or log it in training_step."
        )
    raise MisconfigurationError(
        f"log({name!r}) with on_step=False and on_epoch=False records nothing (here on_epoch defaults to "
        "False, as in Lightning): set on_step=True or on_epoch=True."
    )
