"""Lightning's plugin objects that name a setting fullshard has: each is only that setting,
which ``Trainer(plugins=[...])`` turns into fullshard's own (:mod:`fullshard.plugins.resolve`)."""

from __future__ import annotations

import signal
from typing import Any

from fullshard.errors import MisconfigurationError
from fullshard.launch import environments

_MIXED = ("16-mixed", "bf16-mixed")
_HALF = ("16-true", "bf16-true")


class MixedPrecision:
    """Lightning's automatic mixed precision plugin: ``Trainer(plugins=[MixedPrecision("bf16-mixed",
    "cuda")])`` is ``Trainer(precision="bf16-mixed")``; the device comes from the accelerator."""

    def __init__(self, precision: str, device: str = "cuda", scaler: Any = None) -> None:
        if precision not in _MIXED:
            raise MisconfigurationError(
                f"MixedPrecision(precision={precision!r}): it takes '16-mixed' or 'bf16-mixed'; for other "
                "settings pass Trainer(precision=) itself."
            )
        if scaler is not None:
            raise MisconfigurationError(
                f"MixedPrecision(scaler={type(scaler).__name__}(...)): fullshard makes the gradient scaler of "
                "'16-mixed' itself (a sharded one under FSDP); leave scaler out."
            )
        self.precision = precision
        self.device = device


class HalfPrecision:
    """Lightning's plugin for parameters and compute in half precision: ``HalfPrecision("bf16-true")``
    is ``Trainer(precision="bf16-true")``."""

    def __init__(self, precision: str = "16-true") -> None:
        if precision not in _HALF:
            raise MisconfigurationError(
                f"HalfPrecision(precision={precision!r}): it takes '16-true' or 'bf16-true'; for other "
                "settings pass Trainer(precision=) itself."
            )
        self.precision = precision


class TorchCheckpointIO:
    """Lightning's default checkpoint writer: giving it changes nothing (fullshard writes its
    checkpoints itself, docs/checkpoints.md)."""


class AsyncCheckpointIO:
    """Lightning's background checkpoint writer: ``Trainer(plugins=[AsyncCheckpointIO()])`` turns on
    fullshard's asynchronous saves, ``async_save=True`` of ``FSDP2Strategy(state_dict_type="sharded")``
    or ``ModelParallelStrategy(save_distributed_checkpoint=True)`` (docs/checkpoints.md)."""

    def __init__(self, checkpoint_io: Any = None) -> None:
        if checkpoint_io is not None and not isinstance(checkpoint_io, TorchCheckpointIO):
            raise MisconfigurationError(
                f"AsyncCheckpointIO(checkpoint_io={type(checkpoint_io).__name__}(...)): fullshard writes "
                "checkpoints itself and wraps no other writer; leave checkpoint_io out."
            )
        self.checkpoint_io = checkpoint_io


class LayerSync:
    """Lightning's base of plugins that synchronise layers across processes."""


class TorchSyncBatchNorm(LayerSync):
    """``Trainer(plugins=[TorchSyncBatchNorm()])`` is ``Trainer(sync_batchnorm=True)``."""


class SLURMEnvironment(environments.SLURMEnvironment):
    """fullshard's SLURM environment with Lightning's constructor. Lightning's defaults are
    fullshard's Trainer's (a preempted job is requeued, on SIGUSR1 or SIGTERM); another setting
    is the Trainer's to make, so giving it here is refused with which argument to pass."""

    def __init__(self, auto_requeue: bool = True, requeue_signal: signal.Signals | None = None) -> None:
        super().__init__()
        if not auto_requeue:
            raise MisconfigurationError(
                "SLURMEnvironment(auto_requeue=False): fullshard's Trainer decides the requeue; pass "
                "Trainer(requeue_on_preemption=False) instead."
            )
        if requeue_signal not in (None, signal.SIGUSR1):
            raise MisconfigurationError(
                f"SLURMEnvironment(requeue_signal={requeue_signal!r}): fullshard's Trainer takes the signals; pass "
                "Trainer(preemption_signals=(...)) instead (docs/clusters.md)."
            )
        self.auto_requeue = auto_requeue
        self.requeue_signal = requeue_signal or signal.SIGUSR1
