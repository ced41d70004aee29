"""What ``Module.log`` records: step values, epoch reductions, and where each one goes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fullshard.strategies.strategy import ReduceOp

_REDUCE_FX: tuple[ReduceOp, ...] = ("mean", "sum", "max", "min")


@dataclass
class _EpochAccumulator:
    reduce_fx: ReduceOp
    sync_dist: bool
    prog_bar: bool
    logger: bool
    value: torch.Tensor | None = None
    weight: float = 0.0

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


class MetricsCollector:
    """Collects values from ``Module.log`` and reduces them per step and per epoch.

    Args:
        all_reduce: the strategy's ``all_reduce`` (for ``sync_dist=True``).
    """

    def __init__(self, all_reduce: Callable[[torch.Tensor, ReduceOp], torch.Tensor]) -> None:
        self._all_reduce = all_reduce
        self.stage = "train"
        self.callback_metrics: dict[str, torch.Tensor] = {}
        self._prog_bar: set[str] = set()
        self._pending_log: dict[str, torch.Tensor] = {}
        self._epoch: dict[str, dict[str, _EpochAccumulator]] = {"train": {}, "val": {}}

    def log(
        self,
        name: str,
        value: Any,
        *,
        prog_bar: bool,
        sync_dist: bool,
        on_step: bool | None,
        on_epoch: bool | None,
        reduce_fx: str,
        batch_size: int | None,
        logger: bool,
    ) -> None:
        """Record one value; see :meth:`fullshard.Module.log` for the arguments."""
        if reduce_fx not in _REDUCE_FX:
            raise ValueError(
                f"log({name!r}, reduce_fx={reduce_fx!r}): reduce_fx must be one of "
                f"{', '.join(map(repr, _REDUCE_FX))}."
            )
        tensor = self._to_tensor(name, value)
        training = self.stage == "train"
        on_step = training if on_step is None else on_step
        on_epoch = (not training) if on_epoch is None else on_epoch
        if not on_step and not on_epoch:
            raise ValueError(f"log({name!r}) with on_step=False and on_epoch=False records nothing; set one.")
        reduce: ReduceOp = reduce_fx  # type: ignore[assignment]
        if on_step:
            if sync_dist:
                tensor = self._all_reduce(tensor, reduce)
            key = f"{name}_step" if on_epoch else name
            self.callback_metrics[key] = tensor
            if on_epoch:
                self.callback_metrics[name] = tensor
            if prog_bar:
                self._prog_bar.add(key)
            if logger:
                self._pending_log[key] = tensor
        if on_epoch:
            key = f"{name}_epoch" if on_step else name
            accumulators = self._epoch[self.stage]
            acc = accumulators.get(key)
            if acc is None:
                acc = accumulators[key] = _EpochAccumulator(reduce, sync_dist, prog_bar, logger)
            acc.update(tensor, float(batch_size) if batch_size is not None else 1.0)

    @staticmethod
    def _to_tensor(name: str, value: Any) -> torch.Tensor:
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(
                    f"log({name!r}) got a tensor of shape {tuple(value.shape)}; only scalars can be logged. "
                    "Reduce it first (e.g. value.mean())."
                )
            return value.detach().reshape(()).float()
        if isinstance(value, int | float) and not isinstance(value, bool):
            return torch.tensor(float(value))
        raise TypeError(f"log({name!r}) got a {type(value).__name__}; log a number or a one-element tensor.")

    def pop_step_log(self) -> dict[str, float]:
        """The step values logged since the last call, as floats for a logger."""
        out = {k: float(v) for k, v in self._pending_log.items()}
        self._pending_log.clear()
        return out

    def reduce_epoch(self, stage: str) -> dict[str, float]:
        """Finish the accumulated metrics of ``stage``'s epoch; returns those meant for the logger."""
        for_logger: dict[str, float] = {}
        accumulators = self._epoch[stage]
        for key, acc in accumulators.items():
            if acc.value is None:
                continue
            value, weight = acc.value, torch.tensor(acc.weight)
            if acc.sync_dist:
                value = self._all_reduce(value, "sum" if acc.reduce_fx in ("mean", "sum") else acc.reduce_fx)
                if acc.reduce_fx == "mean":
                    weight = self._all_reduce(weight, "sum")
            if acc.reduce_fx == "mean":
                value = value / weight
            self.callback_metrics[key] = value
            if key.endswith("_epoch"):
                self.callback_metrics[key[: -len("_epoch")]] = value
            if acc.prog_bar:
                self._prog_bar.add(key)
            if acc.logger:
                for_logger[key] = float(value)
        accumulators.clear()
        return for_logger

    def progress_bar_metrics(self) -> dict[str, float]:
        """The latest values of the metrics logged with ``prog_bar=True``."""
        return {k: float(self.callback_metrics[k]) for k in self._prog_bar if k in self.callback_metrics}
