"""``DeviceStatsMonitor``: the accelerator's statistics (CUDA memory, or the CPU's use) logged
around each batch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from lightning_utilities.core.imports import RequirementCache
from typing_extensions import override

from fullshard.errors import MisconfigurationError
from fullshard.trainer.callbacks.base import Callback
from fullshard.trainer.callbacks.log_steps import logs_due
from fullshard.trainer.loggers.dispatch import send_to_loggers

if TYPE_CHECKING:
    from fullshard.module import Module
    from fullshard.trainer.trainer import Trainer

_PSUTIL_AVAILABLE = RequirementCache("psutil")


def cpu_stats() -> dict[str, float]:
    """The machine's CPU use, memory use and swap use in percent (needs ``psutil``)."""
    import psutil  # type: ignore[import-untyped]

    return {
        "cpu_vm_percent": psutil.virtual_memory().percent,
        "cpu_percent": psutil.cpu_percent(),
        "cpu_swap_percent": psutil.swap_memory().percent,
    }


def device_stats(device: torch.device) -> dict[str, float]:
    """``torch.cuda.memory_stats`` on a GPU, :func:`cpu_stats` on the CPU."""
    if device.type == "cuda":
        return {k: float(v) for k, v in torch.cuda.memory_stats(device).items()}
    return cpu_stats()


class DeviceStatsMonitor(Callback):
    """Logs the device's statistics at the start and end of each training, validation and test
    batch, at the Trainer's logging steps (``log_every_n_steps``), under
    ``DeviceStatsMonitor.<hook>/<stat>``, from every process (each logger writes on rank 0 only).

    Args:
        cpu_stats: also log the CPU's statistics (``psutil``) on a GPU (True); never log them on
            the CPU (False); None: the device's own statistics only.

    Raises:
        MisconfigurationError: at ``fit`` without a logger.
        ModuleNotFoundError: on the CPU without ``psutil`` (``pip install psutil``), unless
            ``cpu_stats=False``.
    """

    def __init__(self, cpu_stats: bool | None = None) -> None:
        self._cpu_stats = cpu_stats

    @override
    def setup(self, trainer: Trainer, pl_module: Module, stage: str) -> None:
        if stage != "fit":
            return
        if not trainer.loggers:
            raise MisconfigurationError(
                "DeviceStatsMonitor logs through the Trainer's loggers, and Trainer(logger=False) has none. Give it a "
                "logger (e.g. CSVLogger) or remove the callback."
            )
        device = trainer.strategy.root_device
        needs_psutil = self._cpu_stats is True or (self._cpu_stats is None and device.type == "cpu")
        if needs_psutil and not _PSUTIL_AVAILABLE:
            raise ModuleNotFoundError(
                "DeviceStatsMonitor reads CPU statistics with `psutil`, which is not installed: pip install psutil "
                "(or pass cpu_stats=False on a GPU)."
            )

    def _log(self, trainer: Trainer, key: str, eval_batch_idx: int | None = None) -> None:
        if not trainer.loggers or not logs_due(trainer, eval_batch_idx):
            return
        step = trainer.fit_loop.progress.batches_that_stepped
        device = trainer.strategy.root_device
        if self._cpu_stats is False and device.type == "cpu":
            return
        stats = device_stats(device)
        if self._cpu_stats and device.type != "cpu":
            stats.update(cpu_stats())
        prefix = f"{type(self).__qualname__}.{key}/"
        send_to_loggers(trainer, {prefix + k: v for k, v in stats.items()}, step)

    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: Module, batch: Any, batch_idx: int) -> None:
        self._log(trainer, "on_train_batch_start")

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: Module, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._log(trainer, "on_train_batch_end")

    @override
    def on_validation_batch_start(
        self, trainer: Trainer, pl_module: Module, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._log(trainer, "on_validation_batch_start", batch_idx)

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
        self._log(trainer, "on_validation_batch_end", batch_idx)

    @override
    def on_test_batch_start(
        self, trainer: Trainer, pl_module: Module, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._log(trainer, "on_test_batch_start", batch_idx)

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
        self._log(trainer, "on_test_batch_end", batch_idx)
