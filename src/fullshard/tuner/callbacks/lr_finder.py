"""``LearningRateFinder``: run the learning rate finder when ``fit`` starts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from typing_extensions import override

from fullshard.trainer.call import TunerExit
from fullshard.trainer.callbacks.base import Callback
from fullshard.tuner.lr_finder import LRFinder, isolate_rng, lr_find

if TYPE_CHECKING:
    from fullshard.module import Module
    from fullshard.trainer.trainer import Trainer


class LearningRateFinder(Callback):
    """Runs :meth:`fullshard.tuner.Tuner.lr_find`'s search in ``on_fit_start``, sets the
    suggested learning rate (``update_attr``) and lets the fit go on from the weights it
    started with. Subclass it and call :meth:`lr_find` from another hook to search again later
    (at given epochs, say). The arguments are :meth:`~fullshard.tuner.Tuner.lr_find`'s
    (``num_training_steps`` is its ``num_training``); ``early_exit=True`` (fullshard's, keyword
    only) ends the ``fit`` call once the search is done, as the Tuner runs it.

    Raises:
        ValueError: for a ``mode`` other than ``"linear"``/``"exponential"``.
    """

    SUPPORTED_MODES = ("linear", "exponential")
    runs_first = 1  # after BatchSizeFinder, before every other callback (as Lightning)

    def __init__(
        self,
        min_lr: float = 1e-8,
        max_lr: float = 1,
        num_training_steps: int = 100,
        mode: str = "exponential",
        early_stop_threshold: float | None = 4.0,
        update_attr: bool = True,
        attr_name: str = "",
        *,
        early_exit: bool = False,
    ) -> None:
        mode = mode.lower()
        if mode not in self.SUPPORTED_MODES:
            raise ValueError(f"LearningRateFinder(mode={mode!r}): use one of {self.SUPPORTED_MODES}.")
        if num_training_steps < 1:
            raise ValueError(
                f"LearningRateFinder(num_training_steps={num_training_steps!r}): give at least 1 step."
            )
        self._min_lr = min_lr
        self._max_lr = max_lr
        self._num_training_steps = num_training_steps
        self._mode = mode
        self._early_stop_threshold = early_stop_threshold
        self._update_attr = update_attr
        self._attr_name = attr_name
        self._early_exit = early_exit
        self.optimal_lr: LRFinder | None = None

    def lr_find(self, trainer: Trainer, pl_module: Module) -> None:
        """Search now (every process must call it at the same point)."""
        with isolate_rng():
            self.optimal_lr = lr_find(
                trainer,
                pl_module,
                min_lr=self._min_lr,
                max_lr=self._max_lr,
                num_training=self._num_training_steps,
                mode=self._mode,
                early_stop_threshold=self._early_stop_threshold,
                update_attr=self._update_attr,
                attr_name=self._attr_name,
            )
        if self._early_exit:
            raise TunerExit()

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: Module) -> None:
        self.lr_find(trainer, pl_module)
