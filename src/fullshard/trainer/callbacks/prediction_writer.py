"""``BasePredictionWriter``: write predictions as they are made, per batch or per run.

This is how to predict on several processes without gathering: each process writes its own
share (``batch_indices`` say which samples of the dataset it holds), and
``Trainer.predict(return_predictions=False)`` keeps nothing in memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from typing_extensions import override

from fullshard.errors import MisconfigurationError
from fullshard.trainer.callbacks.base import Callback

if TYPE_CHECKING:
    from fullshard.module import Module
    from fullshard.trainer.trainer import Trainer

_INTERVALS = ("batch", "epoch", "batch_and_epoch")


class WriteInterval:
    """When a writer writes: ``on_batch`` and/or ``on_epoch`` (Lightning's ``WriteInterval``)."""

    def __init__(self, value: str) -> None:
        self.value = value

    @property
    def on_batch(self) -> bool:
        """Whether :meth:`BasePredictionWriter.write_on_batch_end` is called."""
        return self.value in ("batch", "batch_and_epoch")

    @property
    def on_epoch(self) -> bool:
        """Whether :meth:`BasePredictionWriter.write_on_epoch_end` is called."""
        return self.value in ("epoch", "batch_and_epoch")

    def __eq__(self, other: object) -> bool:
        return (
            other == self.value
            if isinstance(other, str)
            else isinstance(other, WriteInterval) and other.value == self.value
        )

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"WriteInterval({self.value!r})"


class BasePredictionWriter(Callback):
    """Base class for callbacks that write predictions; override :meth:`write_on_batch_end`
    and/or :meth:`write_on_epoch_end`.

    Args:
        write_interval: ``"batch"`` (after each ``predict_step``), ``"epoch"`` (once, after the
            last batch, with all of this process's predictions) or ``"batch_and_epoch"``.

    Example::

        class Writer(BasePredictionWriter):
            def __init__(self, out):
                super().__init__("batch")
                self.out = out

            def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch,
                                   batch_idx, dataloader_idx):
                torch.save({"indices": batch_indices, "prediction": prediction},
                           f"{self.out}/{dataloader_idx}_{trainer.global_rank}_{batch_idx}.pt")

        trainer = Trainer(strategy="ddp", devices=2, callbacks=[Writer("preds")])
        trainer.predict(model, loader, return_predictions=False)
    """

    def __init__(self, write_interval: Literal["batch", "epoch", "batch_and_epoch"] = "batch") -> None:
        if write_interval not in _INTERVALS:
            raise MisconfigurationError(
                f"BasePredictionWriter(write_interval={write_interval!r}): write_interval must be one of "
                f"{', '.join(map(repr, _INTERVALS))}."
            )
        self.interval = WriteInterval(write_interval)

    def write_on_batch_end(
        self,
        trainer: Trainer,
        pl_module: Module,
        prediction: Any,
        batch_indices: Sequence[int] | None,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        """Write the ``prediction`` of one batch; ``batch_indices``: the dataset indices of its
        samples (this process's share)."""
        raise NotImplementedError(
            f"{type(self).__name__} writes per batch (write_interval={self.interval.value!r}) but does not "
            "define write_on_batch_end(); define it, or pass write_interval='epoch'."
        )

    def write_on_epoch_end(
        self, trainer: Trainer, pl_module: Module, predictions: Sequence[Any], batch_indices: Sequence[Any]
    ) -> None:
        """Write all of this process's ``predictions`` (a list per dataloader when there are
        several); ``batch_indices``: each batch's dataset indices, a list per dataloader also
        when there is one (``batch_indices[0][i]`` for batch ``i`` of the only one), as Lightning."""
        raise NotImplementedError(
            f"{type(self).__name__} writes per epoch (write_interval={self.interval.value!r}) but does not "
            "define write_on_epoch_end(); define it, or pass write_interval='batch'."
        )

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
        if not self.interval.on_batch:
            return
        batch_indices = trainer.predict_loop.current_batch_indices
        self.write_on_batch_end(trainer, pl_module, outputs, batch_indices, batch, batch_idx, dataloader_idx)

    @override
    def on_predict_epoch_end(self, trainer: Trainer, pl_module: Module) -> None:
        if not self.interval.on_epoch:
            return
        loop = trainer.predict_loop
        self.write_on_epoch_end(trainer, pl_module, loop.predictions, loop.epoch_batch_indices)
