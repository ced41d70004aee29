"""``ThroughputMonitor``: batches, samples and FLOPs per second, and the model FLOPs utilisation
(MFU) where the device's peak is known; ``measure_flops`` counts a model's FLOPs with torch's
flop counter (``torch.utils.flop_counter.FlopCounterMode``)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from fullshard.rank_zero import rank_zero_warn
from fullshard.trainer.callbacks.base import Callback
from fullshard.trainer.callbacks.log_steps import logs_due
from fullshard.trainer.loggers.dispatch import send_to_loggers

if TYPE_CHECKING:
    from fullshard.module import Module
    from fullshard.trainer.trainer import Trainer

# Dense peak FLOP/s of GPUs by name (from the vendors' data sheets), for the MFU.
_PEAK_FLOPS: dict[str, dict[torch.dtype | str, float]] = {
    "h200": {
        torch.float64: 3.4e13,
        torch.float32: 6.7e13,
        "tfloat32": 4.95e14,
        torch.bfloat16: 9.89e14,
        torch.float16: 9.89e14,
    },
    "h100 sxm": {
        torch.float64: 3.35e13,
        torch.float32: 6.69e13,
        "tfloat32": 4.947e14,
        torch.bfloat16: 9.894e14,
        torch.float16: 9.894e14,
    },
    "h100 pcie": {
        torch.float64: 2.56e13,
        torch.float32: 5.12e13,
        "tfloat32": 3.78e14,
        torch.bfloat16: 7.56e14,
        torch.float16: 7.56e14,
    },
    "h100 nvl": {
        torch.float64: 3.0e13,
        torch.float32: 6.0e13,
        "tfloat32": 4.17e14,
        torch.bfloat16: 8.35e14,
        torch.float16: 8.35e14,
    },
    "a100": {
        torch.float64: 9.7e12,
        torch.float32: 1.95e13,
        "tfloat32": 1.56e14,
        torch.bfloat16: 3.12e14,
        torch.float16: 3.12e14,
    },
    "l40s": {torch.float32: 9.16e13, "tfloat32": 1.83e14, torch.bfloat16: 3.62e14, torch.float16: 3.62e14},
    "l4": {torch.float32: 3.03e13, "tfloat32": 6.0e13, torch.bfloat16: 1.21e14, torch.float16: 1.21e14},
    "a10g": {torch.float32: 3.12e13, "tfloat32": 6.25e13, torch.bfloat16: 1.25e14, torch.float16: 1.25e14},
    "v100": {torch.float64: 7.8e12, torch.float32: 1.57e13, torch.float16: 1.25e14},
}
_STAGES = {"fit": "train", "validate": "validate", "test": "test", "predict": "predict"}


def measure_flops(
    model: torch.nn.Module,
    forward_fn: Callable[[], torch.Tensor],
    loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> int:
    """The FLOPs of ``forward_fn()`` (and, with ``loss_fn``, of ``loss_fn(output).backward()``),
    counted by torch's flop counter. Build the model on the meta device to count without
    memory or compute: ``with torch.device("meta"): model = Net()``."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        output = forward_fn()
        if loss_fn is not None:
            loss_fn(output).backward()
    return int(counter.get_total_flops())


def get_available_flops(device: torch.device, dtype: torch.dtype | str) -> int | None:
    """The device's peak FLOP/s for ``dtype`` (``"tfloat32"`` for TF32 matmuls), or None when
    it is not known (CPUs, GPUs not in the table)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device).lower()
    if dtype is torch.float32 and torch.get_float32_matmul_precision() != "highest":
        dtype = "tfloat32"
    for key in sorted(_PEAK_FLOPS, key=len, reverse=True):  # "h100 sxm" before "h100"
        words = key.split()
        if all(word in name for word in words):
            peak = _PEAK_FLOPS[key].get(dtype)
            return None if peak is None else int(peak)
    if "h100" in name:
        peak = _PEAK_FLOPS["h100 sxm"].get(dtype)
        return None if peak is None else int(peak)
    rank_zero_warn(f"ThroughputMonitor: the peak FLOP/s of {name!r} is not known; the MFU is not logged.")
    return None


def _compute_dtype(precision: str) -> torch.dtype:
    if precision.startswith("bf16"):
        return torch.bfloat16
    if precision.startswith("16"):
        return torch.float16
    if precision.startswith("64"):
        return torch.float64
    return torch.float32


class Throughput:
    """Throughput over a sliding window of the last ``window_size`` updates (cumulative counts
    in, rates out), as Lightning's ``Throughput``. ``world_size`` scales one process's counts to
    the job's."""

    def __init__(
        self,
        available_flops: float | None = None,
        world_size: int = 1,
        window_size: int = 100,
        separator: str = "/",
    ) -> None:
        if world_size < 1:
            raise ValueError(f"Throughput(world_size={world_size!r}): give the number of processes, >= 1.")
        if window_size < 2:
            raise ValueError(
                f"Throughput(window_size={window_size!r}): rates need a window of at least 2 updates."
            )
        self.available_flops = available_flops
        self.world_size = world_size
        self.separator = separator
        self._time: deque[float] = deque(maxlen=window_size)
        self._batches: deque[int] = deque(maxlen=window_size)
        self._samples: deque[int] = deque(maxlen=window_size)
        self._lengths: deque[int] = deque(maxlen=window_size)
        self._flops: deque[float] = deque(maxlen=window_size)

    def update(
        self,
        *,
        time: float,
        batches: int,
        samples: int,
        lengths: int | None = None,
        flops: float | None = None,
    ) -> None:
        """Add the cumulative ``time`` (seconds), ``batches``, ``samples`` (and ``lengths``,
        items such as tokens) so far, and the FLOPs of the latest batch."""
        if samples < batches:
            raise ValueError(f"Throughput.update: samples ({samples}) must be >= batches ({batches}).")
        if self._time and time < self._time[-1]:
            raise ValueError(f"Throughput.update: time must not decrease ({self._time[-1]} then {time}).")
        self._time.append(time)
        self._batches.append(batches)
        self._samples.append(samples)
        if lengths is not None:
            if lengths < samples:
                raise ValueError(f"Throughput.update: lengths ({lengths}) must be >= samples ({samples}).")
            self._lengths.append(lengths)
        if flops is not None:
            self._flops.append(flops * self.world_size)

    def compute(self) -> dict[str, int | float]:
        """The totals, and the rates once the window is full."""
        sep = self.separator
        metrics: dict[str, int | float] = {
            "time": self._time[-1],
            "batches": self._batches[-1],
            "samples": self._samples[-1],
        }
        if self._lengths:
            metrics["lengths"] = self._lengths[-1]
        several = self.world_size > 1
        window = self._time.maxlen
        if len(self._time) == window:
            elapsed = self._time[-1] - self._time[0]
            batches_per_sec = (self._batches[-1] - self._batches[0]) / elapsed
            samples_per_sec = (self._samples[-1] - self._samples[0]) / elapsed
            metrics[f"device{sep}batches_per_sec"] = batches_per_sec
            metrics[f"device{sep}samples_per_sec"] = samples_per_sec
            if several:
                metrics["batches_per_sec"] = batches_per_sec * self.world_size
                metrics["samples_per_sec"] = samples_per_sec * self.world_size
            if len(self._lengths) == window:
                items_per_sec = (self._lengths[-1] - self._lengths[0]) / elapsed
                metrics[f"device{sep}items_per_sec"] = items_per_sec
                if several:
                    metrics["items_per_sec"] = items_per_sec * self.world_size
        if len(self._flops) == self._flops.maxlen:
            flops_per_sec = (sum(self._flops) - self._flops[0]) / (self._time[-1] - self._time[0])
            device_flops_per_sec = flops_per_sec / self.world_size
            if several:
                metrics["flops_per_sec"] = flops_per_sec
            metrics[f"device{sep}flops_per_sec"] = device_flops_per_sec
            if self.available_flops:
                metrics[f"device{sep}mfu"] = device_flops_per_sec / self.available_flops
        return metrics

    def reset(self) -> None:
        for window in (self._time, self._batches, self._samples, self._lengths, self._flops):
            window.clear()


class ThroughputMonitor(Callback):
    """Logs throughput (``train/samples_per_sec``, ``train/device/flops_per_sec``,
    ``train/device/mfu``, ... and the same for validation, test and predict) from global rank 0,
    at the Trainer's logging steps.

    FLOPs come from the module's ``flops_per_batch`` attribute: set it with
    :func:`measure_flops` (torch's flop counter), e.g. in ``setup``. The MFU is logged where the
    device's peak FLOP/s is known (:func:`get_available_flops`; not on CPUs).

    Args:
        batch_size_fn: batch to the number of samples in it.
        length_fn: batch to the number of items in it (tokens, say), for ``items_per_sec``.
        **kwargs: :class:`Throughput`'s ``window_size`` (default 100) and ``separator`` (``"/"``).
    """

    def __init__(
        self,
        batch_size_fn: Callable[[Any], int],
        length_fn: Callable[[Any], int] | None = None,
        **kwargs: Any,
    ) -> None:
        unknown = sorted(set(kwargs) - {"window_size", "separator"})
        if unknown:
            raise TypeError(
                f"ThroughputMonitor got unexpected keyword arguments {unknown}; accepted: window_size, separator."
            )
        self.kwargs = kwargs
        self.batch_size_fn = batch_size_fn
        self.length_fn = length_fn
        self.available_flops: int | None = None
        self._throughputs: dict[str, Throughput] = {}
        self._t0s: dict[str, float] = {}
        self._lengths: dict[str, int] = {}
        self._samples: dict[str, int] = {}
        self._batches: dict[str, int] = {}
        self._module_has_flops: bool | None = None
        self._fitting = False

    @override
    def setup(self, trainer: Trainer, pl_module: Module, stage: str) -> None:
        self.available_flops = get_available_flops(
            trainer.strategy.root_device, _compute_dtype(trainer.precision)
        )
        self._fitting = stage == "fit"
        stages = ["train", "validate"] if stage == "fit" else [_STAGES[stage]]
        for name in stages:
            self._throughputs[name] = Throughput(
                available_flops=self.available_flops, world_size=trainer.world_size, **self.kwargs
            )

    def _start(self, stage: str) -> None:
        if self._fitting or stage not in self._samples:
            self._throughputs[stage].reset()
            self._lengths[stage] = self._samples[stage] = self._batches[stage] = 0
        self._t0s[stage] = time.perf_counter()

    @torch.inference_mode()
    def _update(self, trainer: Trainer, pl_module: Module, batch: Any, stage: str) -> None:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - self._t0s[stage]
        if self.length_fn is not None:
            self._lengths[stage] += self.length_fn(batch)
        if self._module_has_flops is None:
            self._module_has_flops = hasattr(pl_module, "flops_per_batch")
            if not self._module_has_flops:
                rank_zero_warn(
                    f"ThroughputMonitor: {type(pl_module).__name__} has no `flops_per_batch` attribute, so no FLOPs are "
                    "logged. Set it, e.g. with fullshard.callbacks.measure_flops, to get FLOP/s and the MFU."
                )
        self._samples[stage] += self.batch_size_fn(batch)
        self._batches[stage] += 1
        self._throughputs[stage].update(
            time=elapsed,
            batches=self._batches[stage],
            samples=self._samples[stage],
            lengths=None if self.length_fn is None else self._lengths[stage],
            flops=getattr(pl_module, "flops_per_batch", None) if self._module_has_flops else None,
        )

    def _log(self, trainer: Trainer, stage: str, step: int, due: bool) -> None:
        if not due:
            return
        throughput = self._throughputs[stage]
        metrics = {f"{stage}{throughput.separator}{k}": v for k, v in throughput.compute().items()}
        send_to_loggers(trainer, metrics, step)  # type: ignore[arg-type]  # ints stay ints, as in Lightning

    @override
    def on_train_start(self, trainer: Trainer, pl_module: Module) -> None:
        if trainer.is_global_zero:
            self._start("train")

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: Module, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not trainer.is_global_zero:
            return
        self._update(trainer, pl_module, batch, "train")
        boundary = (batch_idx + 1) % trainer.accumulate_grad_batches == 0 or trainer.is_last_batch
        if boundary:
            self._log(trainer, "train", trainer.fit_loop.progress.batches_that_stepped, logs_due(trainer))

    @override
    def on_validation_start(self, trainer: Trainer, pl_module: Module) -> None:
        if trainer.is_global_zero and not trainer.sanity_checking:
            self._start("validate")

    @override
    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: Module,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if trainer.is_global_zero and not trainer.sanity_checking:
            self._update(trainer, pl_module, batch, "validate")
            self._log(trainer, "validate", self._batches["validate"], logs_due(trainer, batch_idx))

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: Module) -> None:
        if (
            not trainer.is_global_zero
            or trainer.sanity_checking
            or not self._fitting
            or "train" not in self._t0s
        ):
            return
        # the validation's time is not training time: move the training clock's start past it
        train_times, val_times = self._throughputs["train"]._time, self._throughputs["validate"]._time
        train_finished = self._t0s["train"] + (train_times[-1] if train_times else 0.0)
        gap = self._t0s["validate"] - train_finished
        self._t0s["train"] += gap + (val_times[-1] if val_times else 0.0)

    @override
    def on_test_start(self, trainer: Trainer, pl_module: Module) -> None:
        if trainer.is_global_zero:
            self._start("test")

    @override
    def on_test_batch_end(
        self,
        trainer: Trainer,
        pl_module: Module,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if trainer.is_global_zero:
            self._update(trainer, pl_module, batch, "test")
            self._log(trainer, "test", self._batches["test"], logs_due(trainer, batch_idx))

    @override
    def on_predict_start(self, trainer: Trainer, pl_module: Module) -> None:
        if trainer.is_global_zero:
            self._start("predict")

    @override
    def on_predict_batch_end(
        self,
        trainer: Trainer,
        pl_module: Module,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if trainer.is_global_zero:
            self._update(trainer, pl_module, batch, "predict")
            self._log(trainer, "predict", self._batches["predict"], logs_due(trainer, batch_idx))
