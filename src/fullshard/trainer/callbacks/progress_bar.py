"""A tqdm progress bar for training and validation, shown on global rank 0 only.

Cost on the training path: one integer increment and one ``tqdm.update`` call per batch (and
fewer with ``refresh_rate > 1``); tqdm itself redraws at most every ``mininterval`` seconds.
The postfix (global step and the ``prog_bar`` metrics) is formatted only when tqdm actually
redraws the bar, never per batch; see ``_TrainBar``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from tqdm import tqdm
from typing_extensions import override

from fullshard.trainer.callbacks.base import Callback

if TYPE_CHECKING:
    from fullshard.module import Module
    from fullshard.trainer.trainer import Trainer

__all__ = ["ProgressBar"]


class _TrainBar(tqdm):  # type: ignore[misc]  # tqdm ships no type information
    """A tqdm bar whose postfix comes from a callable, evaluated only when the bar is drawn.

    ``set_postfix`` formats its text eagerly, which would cost a string format per batch even
    though tqdm draws a few times a second at most. tqdm reads everything it draws from
    ``format_dict``, so the postfix is produced there instead.
    """

    def __init__(self, postfix_fn: Callable[[], str], **kwargs: Any) -> None:
        # Set before tqdm's __init__, which may draw the bar right away.
        self._postfix_fn = postfix_fn
        super().__init__(**kwargs)

    @property
    def format_dict(self) -> dict[str, Any]:
        values: dict[str, Any] = super().format_dict
        values["postfix"] = self._postfix_fn()
        return values


def _format_value(value: float) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _finite_total(count: float) -> int | None:
    """A batch count as tqdm's ``total``: ``None`` when unknown (infinite)."""
    return int(count) if math.isfinite(count) else None


class ProgressBar(Callback):
    """Shows one bar per training epoch and a transient bar for each validation run.

    The training bar reads ``Epoch <n>``, counts batches of the epoch (starting from the
    batches a resumed run already did) and shows the global step and the metrics logged with
    ``prog_bar=True`` after it. Only global rank 0 draws; on other ranks every hook returns
    at once.

    Args:
        refresh_rate: Advance the bars every this many batches. 1 shows the exact count; a
            larger value saves a little time per batch when batches are very fast.
        mininterval: Minimum seconds between two redraws (tqdm's ``mininterval``).
        file: Stream to draw on; standard error when ``None``.
    """

    def __init__(self, refresh_rate: int = 1, mininterval: float = 0.2, file: TextIO | None = None) -> None:
        if refresh_rate < 1:
            raise ValueError(
                f"`refresh_rate` must be a positive integer, got {refresh_rate!r}. "
                "To hide the progress bar, call `disable()` or leave the callback out."
            )
        if mininterval < 0:
            raise ValueError(f"`mininterval` must be >= 0 seconds, got {mininterval!r}.")
        self.refresh_rate = refresh_rate
        self.mininterval = mininterval
        self.file = file
        self._enabled = True
        self._train_bar: _TrainBar | None = None
        self._val_bar: tqdm | None = None
        self._train_pending = 0  # batches done but not yet passed to the bar
        self._val_pending = 0

    @property
    def is_enabled(self) -> bool:
        """Whether bars are drawn (on global rank 0)."""
        return self._enabled

    def disable(self) -> None:
        """Stop drawing, closing any open bar."""
        self._enabled = False
        self._close_all()

    def enable(self) -> None:
        """Draw bars again after :meth:`disable`."""
        self._enabled = True

    # ----- training -----

    @override
    def on_train_epoch_start(self, trainer: Trainer, module: Module) -> None:
        self._close_train_bar()
        if not (self._enabled and trainer.is_global_zero):
            return
        self._train_pending = 0
        self._train_bar = _TrainBar(
            postfix_fn=lambda: self._train_postfix(trainer),
            desc=f"Epoch {trainer.current_epoch}",
            total=_finite_total(trainer.num_training_batches),
            initial=getattr(trainer, "batch_idx_start", 0),
            leave=True,
            mininterval=self.mininterval,
            file=self.file,
            dynamic_ncols=True,
        )

    @override
    def on_train_batch_end(
        self, trainer: Trainer, module: Module, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        bar = self._train_bar
        if bar is None:
            return
        self._train_pending += 1
        if self._train_pending >= self.refresh_rate:
            bar.update(self._train_pending)
            self._train_pending = 0

    @override
    def on_train_epoch_end(self, trainer: Trainer, module: Module) -> None:
        self._close_train_bar()

    @override
    def on_train_end(self, trainer: Trainer, module: Module) -> None:
        self._close_all()

    # ----- validation -----

    @override
    def on_validation_start(self, trainer: Trainer, module: Module) -> None:
        self._close_val_bar()
        if not (self._enabled and trainer.is_global_zero):
            return
        self._val_pending = 0
        self._val_bar = tqdm(
            desc="Sanity Checking" if trainer.sanity_checking else "Validation",
            total=_finite_total(
                sum(trainer.num_sanity_val_batches if trainer.sanity_checking else trainer.num_val_batches)
            ),
            leave=False,
            mininterval=self.mininterval,
            file=self.file,
            dynamic_ncols=True,
        )

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
        bar = self._val_bar
        if bar is None:
            return
        self._val_pending += 1
        if self._val_pending >= self.refresh_rate:
            bar.update(self._val_pending)
            self._val_pending = 0

    @override
    def on_validation_end(self, trainer: Trainer, module: Module) -> None:
        self._close_val_bar()
        if self._train_bar is not None:
            # Validation metrics just joined `progress_bar_metrics`; show them without waiting
            # for the next training batch.
            self._train_bar.refresh()

    # ----- shutdown -----

    @override
    def teardown(self, trainer: Trainer, module: Module, stage: str) -> None:
        self._close_all()

    @override
    def on_exception(self, trainer: Trainer, module: Module, exception: BaseException) -> None:
        self._close_all()

    def _train_postfix(self, trainer: Trainer) -> str:
        parts = [f"step={trainer.global_step}"]
        parts.extend(f"{key}={_format_value(value)}" for key, value in trainer.progress_bar_metrics.items())
        return ", ".join(parts)

    def _close_train_bar(self) -> None:
        bar = self._train_bar
        if bar is None:
            return
        if self._train_pending:
            bar.update(self._train_pending)
            self._train_pending = 0
        bar.close()
        self._train_bar = None

    def _close_val_bar(self) -> None:
        bar = self._val_bar
        if bar is None:
            return
        if self._val_pending:
            bar.update(self._val_pending)
            self._val_pending = 0
        bar.close()
        self._val_bar = None

    def _close_all(self) -> None:
        self._close_val_bar()
        self._close_train_bar()
