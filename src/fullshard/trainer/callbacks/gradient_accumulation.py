"""``GradientAccumulationScheduler``: how many micro-batches make an optimizer step, by epoch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from typing_extensions import override

from fullshard.errors import MisconfigurationError
from fullshard.module import Module
from fullshard.rank_zero import rank_zero_warn
from fullshard.trainer.callbacks.base import Callback
from fullshard.trainer.preflight import overrides

if TYPE_CHECKING:
    from fullshard.trainer.trainer import Trainer


class GradientAccumulationScheduler(Callback):
    """Changes ``trainer.accumulate_grad_batches`` at the start of the epochs ``scheduling``
    names, as Lightning's callback does.

    Args:
        scheduling: epoch (counted from 0) to the number of micro-batches per optimizer step
            from that epoch on. ``{0: 8, 4: 4, 8: 1}``: 8 for epochs 0 to 3, 4 for epochs 4 to 7,
            then 1. Without an entry for epoch 0, epochs before the first key accumulate 1.

    Raises:
        TypeError: for an empty ``scheduling``.
        MisconfigurationError: for an epoch that is not an int >= 0 or a factor that is not an
            int >= 1.
    """

    def __init__(self, scheduling: dict[int, int]) -> None:
        if not scheduling:
            raise TypeError(
                "GradientAccumulationScheduler needs a non-empty dict {epoch: accumulate_grad_batches}, e.g. {0: 4, 5: 1}."
            )
        if any(not isinstance(k, int) or isinstance(k, bool) or k < 0 for k in scheduling):
            raise MisconfigurationError(
                f"GradientAccumulationScheduler's epochs must be ints >= 0 (epochs count from 0), got {list(scheduling)}."
            )
        if any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in scheduling.values()):
            raise MisconfigurationError(
                "GradientAccumulationScheduler's accumulation factors must be ints >= 1, got "
                f"{list(scheduling.values())}."
            )
        if min(scheduling) != 0:
            scheduling.update({0: 1})  # as Lightning: the caller's dict gains the entry too
        self.scheduling = scheduling
        self.epochs = sorted(scheduling)

    def going_to_accumulate_grad_batches(self) -> bool:
        """Whether any epoch accumulates more than one micro-batch."""
        return any(v > 1 for v in self.scheduling.values())

    def get_accumulate_grad_batches(self, epoch: int) -> int:
        """The factor in force in ``epoch``."""
        for start in reversed(self.epochs):
            if epoch >= start:
                return self.scheduling[start]
        return 1

    @override
    def on_train_start(self, trainer: Trainer, pl_module: Module) -> None:
        if not pl_module.automatic_optimization:
            raise RuntimeError(
                "GradientAccumulationScheduler works with automatic optimization only: under manual optimization "
                "the module decides when to step. Remove the callback, or accumulate in training_step yourself."
            )
        custom = overrides(pl_module, Module, "optimizer_step") or overrides(
            pl_module, Module, "optimizer_zero_grad"
        )
        if custom and self.going_to_accumulate_grad_batches():
            rank_zero_warn(
                "With gradient accumulation, the module's optimizer_step/optimizer_zero_grad overrides are called "
                "once per optimizer step, not once per batch."
            )
        if trainer.accumulate_grad_batches != 1:
            raise ValueError(
                f"Trainer(accumulate_grad_batches={trainer.accumulate_grad_batches}) was given together with a "
                "GradientAccumulationScheduler: remove one of them (put the factor for epoch 0 in the scheduling)."
            )

    @override
    def on_train_epoch_start(self, trainer: Trainer, *_: Any) -> None:
        trainer.accumulate_grad_batches = self.get_accumulate_grad_batches(trainer.current_epoch)
