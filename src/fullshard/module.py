"""``fullshard.Module``: an ``nn.Module`` with the hooks the Trainer drives."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from fullshard.trainer.trainer import Trainer

OptimizerConfig = Any
"""What ``configure_optimizers`` returns: an optimizer, or a dict with ``"optimizer"`` and
optionally ``"lr_scheduler"`` (a scheduler, or a dict ``{"scheduler", "interval", "frequency"}``)."""


class Module(nn.Module):
    """Base class for models trained by :class:`fullshard.Trainer`.

    Override :meth:`training_step` and :meth:`configure_optimizers`; optionally
    :meth:`validation_step`, :meth:`configure_model` (to build big layers directly on the right
    device, or sharded) and the checkpoint hooks.
    """

    def __init__(self) -> None:
        super().__init__()
        self._trainer: Trainer | None = None
        self.hparams: dict[str, Any] = {}

    # ------------------------------------------------------------------------------- hooks
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        """Compute the loss of one batch.

        Return the loss tensor, a dict with a ``"loss"`` entry, or None to skip the batch.
        """
        raise NotImplementedError(
            f"{type(self).__name__} does not define training_step(batch, batch_idx); the Trainer needs "
            "it to compute a loss. Override it and return the loss tensor."
        )

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        """Evaluate one validation batch; log metrics with :meth:`log`."""
        raise NotImplementedError(
            f"{type(self).__name__} does not define validation_step(batch, batch_idx), but validation data "
            "was given. Override validation_step, or pass no val_dataloaders."
        )

    def configure_optimizers(self) -> OptimizerConfig:
        """Return an optimizer, or ``{"optimizer": opt, "lr_scheduler": sched_or_config}``.

        A scheduler config is a dict ``{"scheduler": sched, "interval": "step" | "epoch",
        "frequency": n}``. Called after the strategy wrapped the model, so ``self.parameters()``
        are the parameters that will be trained.
        """
        raise NotImplementedError(
            f"{type(self).__name__} does not define configure_optimizers(); the Trainer needs an optimizer. "
            "Override it, e.g. `return torch.optim.AdamW(self.parameters(), lr=1e-3)`."
        )

    def configure_model(self) -> None:
        """Build (large) layers here instead of ``__init__``.

        The Trainer calls it inside the strategy's initialisation and sharding contexts, so layers
        are created directly on the target device (or the meta device, for sharded strategies).
        It may be called more than once (``fit`` after ``validate``): make it idempotent, e.g.
        ``if self.model is not None: return``.
        """

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Add or change entries of a checkpoint as it is written."""

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Read custom entries of a checkpoint as it is restored (before the weights load)."""

    def on_fit_start(self) -> None:
        """Called when training starts, after setup and before the first epoch."""

    def on_fit_end(self) -> None:
        """Called when training ends."""

    def on_train_epoch_start(self) -> None:
        """Called at the start of each training epoch."""

    def on_train_epoch_end(self) -> None:
        """Called at the end of each training epoch."""

    def on_validation_epoch_end(self) -> None:
        """Called after each validation run, when its metrics are reduced."""

    # ----------------------------------------------------------------------------- helpers
    @property
    def trainer(self) -> Trainer:
        """The Trainer running this module."""
        if self._trainer is None:
            raise RuntimeError(
                f"{type(self).__name__} is not attached to a Trainer. `self.trainer` is available inside "
                "the hooks called by Trainer.fit() / Trainer.validate()."
            )
        return self._trainer

    @property
    def device(self) -> torch.device:
        """The device this module computes on."""
        if self._trainer is not None:
            return self._trainer.strategy.root_device
        for param in self.parameters():
            return param.device
        return torch.device("cpu")

    def log(
        self,
        name: str,
        value: Any,
        prog_bar: bool = False,
        sync_dist: bool = False,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        reduce_fx: str = "mean",
        batch_size: int | None = None,
        logger: bool = True,
    ) -> None:
        """Record a scalar metric.

        Args:
            name: metric name.
            value: a number or a one-element tensor.
            prog_bar: show it in the progress bar.
            sync_dist: reduce it across processes (costs a collective each call).
            on_step: record the value of each step. Defaults to True in training, False in validation.
            on_epoch: record the ``reduce_fx`` over the epoch. Defaults to False in training, True
                in validation. With both on, the metric appears as ``name_step`` and ``name_epoch``.
            reduce_fx: ``"mean"``, ``"sum"``, ``"max"`` or ``"min"`` (epoch and cross-process reduction).
            batch_size: weight of this value in the epoch mean (default 1).
            logger: send it to the logger.
        """
        self.trainer._metrics.log(
            name,
            value,
            prog_bar=prog_bar,
            sync_dist=sync_dist,
            on_step=on_step,
            on_epoch=on_epoch,
            reduce_fx=reduce_fx,
            batch_size=batch_size,
            logger=logger,
        )

    def log_dict(self, metrics: Mapping[str, Any], **kwargs: Any) -> None:
        """Call :meth:`log` for each entry of ``metrics`` with the same options."""
        for name, value in metrics.items():
            self.log(name, value, **kwargs)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on global rank 0 only."""
        if self._trainer is None or self._trainer.is_global_zero:
            print(*args, **kwargs)

    def save_hyperparameters(self, *names: str, **values: Any) -> None:
        """Store constructor arguments in :attr:`hparams` (and so in every checkpoint).

        Called without arguments inside ``__init__`` it records every argument of ``__init__``;
        ``names`` selects some of them; keyword ``values`` are stored as given.
        """
        frame = inspect.currentframe()
        caller = frame.f_back if frame is not None else None
        if caller is not None and not values:
            arguments = inspect.getargvalues(caller)
            local = {k: arguments.locals[k] for k in arguments.args if k != "self"}
            if arguments.keywords:
                local.update(arguments.locals.get(arguments.keywords, {}))
            unknown = [n for n in names if n not in local]
            if unknown:
                raise ValueError(
                    f"save_hyperparameters got {unknown}, which are not arguments of the calling "
                    f"function (it has {sorted(local)}). Pass argument names, or keyword values."
                )
            self.hparams.update({k: v for k, v in local.items() if not names or k in names})
        self.hparams.update(values)
