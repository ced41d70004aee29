"""``SpikeDetection``: stop training when the loss jumps far above its running mean."""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

import torch
from typing_extensions import override

from fullshard.trainer.callbacks.base import Callback

if TYPE_CHECKING:
    from fullshard.module import Module
    from fullshard.trainer.trainer import Trainer


class TrainingSpikeException(RuntimeError):
    """Raised by :class:`SpikeDetection` at the batch where the loss spiked."""

    def __init__(self, batch_idx: int, *args: Any) -> None:
        super().__init__(f"Training spike detected in batch {batch_idx}", *args)
        self.batch_idx = batch_idx


class SpikeDetection(Callback):
    """After each training batch, compares the loss with the mean of the last ``window`` losses;
    a spike (worse than the previous loss, and off the mean by more than ``atol`` and
    ``rtol * mean``; or a non-finite loss with ``finite_only``) on any process writes the batch
    indices around it to ``exclude_batches_path`` (global rank 0) and raises
    :class:`TrainingSpikeException` on every process, as Lightning's.

    Args:
        mode: ``"min"`` when a lower loss is better, ``"max"`` otherwise.
        window: the number of losses in the running mean.
        warmup: batches at the start that are never spikes.
        atol, rtol: the absolute and relative deviation from the mean that make a spike (None:
            that test passes).
        exclude_batches_path: a ``.json`` file, or a directory for ``skip_batches.json``
            (default: the Trainer's ``default_root_dir``).
        finite_only: a NaN or infinite loss is a spike (False: it is left out of the mean).

    Raises:
        ValueError: for a ``mode`` other than ``"min"``/``"max"`` or a ``window`` below 1.
    """

    def __init__(
        self,
        mode: Literal["min", "max"] = "min",
        window: int = 10,
        warmup: int = 1,
        atol: float | None = None,
        rtol: float | None = 2.0,
        exclude_batches_path: str | os.PathLike[str] | None = None,
        finite_only: bool = True,
    ) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"SpikeDetection(mode={mode!r}): use 'min' (lower loss is better) or 'max'.")
        if window < 1:
            raise ValueError(
                f"SpikeDetection(window={window!r}): the running mean needs a window of at least 1."
            )
        self.mode = mode
        self.window = window
        self.warmup = warmup
        self.atol = atol
        self.rtol = rtol
        self.exclude_batches_path: str | None = (
            None if exclude_batches_path is None else str(exclude_batches_path)
        )
        self.finite_only = finite_only
        self.last_val: float = 0.0
        self.bad_batches: list[int] = []
        self._values: deque[float] = deque(maxlen=window)

    def _running_mean(self) -> float:
        return sum(self._values) / len(self._values) if self._values else float("nan")

    def _is_spike(self, loss: float) -> bool:
        if self.finite_only and not torch.isfinite(torch.tensor(loss)):
            return True
        difference = loss - self.last_val
        if (difference <= 0.0) if self.mode == "min" else (difference >= 0.0):
            return False
        mean = self._running_mean()
        atol_ok = self.atol is None or abs(loss - mean) >= abs(self.atol)
        rtol_ok = self.rtol is None or abs(loss - mean) >= abs(self.rtol * mean)
        return atol_ok and rtol_ok

    @override
    @torch.no_grad()
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: Module, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if isinstance(outputs, torch.Tensor):
            loss_tensor = outputs.detach()
        elif isinstance(outputs, Mapping):
            loss_tensor = outputs["loss"].detach()
        else:
            raise TypeError(
                f"SpikeDetection needs the training step's loss: outputs is {type(outputs).__qualname__}, expected a "
                "tensor or a mapping with 'loss'."
            )
        if self.exclude_batches_path is None:
            self.exclude_batches_path = trainer.default_root_dir
        if not self.exclude_batches_path.endswith(".json"):
            self.exclude_batches_path = os.path.join(self.exclude_batches_path, "skip_batches.json")
        loss = float(loss_tensor)
        spike = batch_idx >= self.warmup and self._is_spike(loss)
        strategy = trainer.strategy
        if strategy.reduce_boolean_decision(spike, all=False):
            self._handle_spike(trainer, batch_idx)
        finite = self.finite_only or strategy.reduce_boolean_decision(
            bool(torch.isfinite(loss_tensor).all()), all=True
        )
        if finite:
            self._values.append(loss)
            self.last_val = loss

    def _handle_spike(self, trainer: Trainer, batch_idx: int) -> None:
        self.bad_batches.extend([batch_idx - 1, batch_idx])
        if trainer.is_global_zero:
            assert self.exclude_batches_path is not None
            os.makedirs(os.path.dirname(self.exclude_batches_path) or ".", exist_ok=True)
            with open(self.exclude_batches_path, "w") as f:
                json.dump(self.bad_batches, f, indent=4)
        raise TrainingSpikeException(batch_idx=batch_idx)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "last_val": self.last_val,
            "mode": self.mode,
            "warmup": self.warmup,
            "atol": self.atol,
            "rtol": self.rtol,
            "bad_batches": self.bad_batches,
            "bad_batches_path": self.exclude_batches_path,
            "values": list(self._values),
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.last_val = state_dict["last_val"]
        self.mode = state_dict["mode"]
        self.warmup = state_dict["warmup"]
        self.atol = state_dict["atol"]
        self.rtol = state_dict["rtol"]
        self.bad_batches = state_dict["bad_batches"]
        self.exclude_batches_path = state_dict["bad_batches_path"]
        self._values = deque(state_dict.get("values", []), maxlen=self.window)
