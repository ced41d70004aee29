"""``BatchSizeFinder``: run the batch size finder when ``fit`` starts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from typing_extensions import override

from fullshard.errors import MisconfigurationError
from fullshard.rank_zero import rank_zero_warn
from fullshard.trainer.call import TunerExit
from fullshard.trainer.callbacks.base import Callback
from fullshard.tuner.batch_size_scaling import has_batch_size, scale_batch_size

if TYPE_CHECKING:
    from fullshard.module import Module
    from fullshard.trainer.trainer import Trainer


class BatchSizeFinder(Callback):
    """Runs :meth:`fullshard.tuner.Tuner.scale_batch_size`'s search in ``on_fit_start`` and
    trains on with the batch size found (the weights it started with are put back). The
    arguments are :meth:`~fullshard.tuner.Tuner.scale_batch_size`'s (``early_exit=True``,
    fullshard's, keyword only: end the ``fit`` call once the search is done, as the Tuner runs
    it). Works with several
    processes too: a trial counts as out of memory when any process ran out (Lightning refuses
    distributed runs); an out-of-memory error inside a collective can still leave the other
    processes waiting in it.

    Raises:
        ValueError: for an unknown ``mode`` or a ``margin`` outside [0, 1).
        MisconfigurationError: in ``setup``, when the dataloaders were passed to ``fit`` (they
            cannot be rebuilt at another batch size) or the batch size attribute is missing.
    """

    SUPPORTED_MODES = ("power", "binsearch")
    runs_first = 0  # before every other callback, LearningRateFinder included (as Lightning)

    def __init__(
        self,
        mode: str = "power",
        steps_per_trial: int = 3,
        init_val: int = 2,
        max_trials: int = 25,
        batch_arg_name: str = "batch_size",
        margin: float = 0.05,
        max_val: int = 8192,
        *,
        early_exit: bool = False,
    ) -> None:
        mode = mode.lower()
        if mode not in self.SUPPORTED_MODES:
            raise ValueError(f"BatchSizeFinder(mode={mode!r}): use one of {self.SUPPORTED_MODES}.")
        if not 0.0 <= margin < 1.0:
            raise ValueError(f"BatchSizeFinder(margin={margin!r}): give a fraction in [0, 1), e.g. 0.05.")
        self.optimal_batch_size: int | None = init_val
        self._mode = mode
        self._steps_per_trial = steps_per_trial
        self._init_val = init_val
        self._max_trials = max_trials
        self._batch_arg_name = batch_arg_name
        self._margin = margin
        self._max_val = max_val
        self._early_exit = early_exit

    @override
    def setup(self, trainer: Trainer, pl_module: Module, stage: str) -> None:
        if stage != "fit":
            raise MisconfigurationError(
                f"fullshard's BatchSizeFinder searches with training steps, in fit; it was given to {stage}()."
            )
        data = trainer.data_sources
        if data is not None and data.loaders.get("train") is not None:
            raise MisconfigurationError(
                "The batch size finder rebuilds the dataloaders at each batch size, so it cannot use dataloaders "
                "passed to fit(). Build them in the module's or DataModule's train_dataloader() from "
                f"self.{self._batch_arg_name}."
            )
        if not has_batch_size(pl_module, self._batch_arg_name):
            raise MisconfigurationError(
                f"The batch size finder sets `{self._batch_arg_name}`, which is not an attribute (or hparams entry) of "
                "the model or the DataModule. Add it and read it in train_dataloader(), or pass batch_arg_name=..."
            )
        if hasattr(pl_module, self._batch_arg_name) and self._batch_arg_name in getattr(
            pl_module, "hparams", {}
        ):
            rank_zero_warn(
                f"Both model.{self._batch_arg_name} and model.hparams.{self._batch_arg_name} exist: the search starts "
                f"from model.{self._batch_arg_name}; remove one of them."
            )

    def scale_batch_size(self, trainer: Trainer, pl_module: Module) -> None:
        """Search now (every process must call it at the same point)."""
        self.optimal_batch_size = scale_batch_size(
            trainer,
            pl_module,
            self._mode,
            self._steps_per_trial,
            self._init_val,
            self._max_trials,
            self._batch_arg_name,
            self._margin,
            self._max_val,
        )
        if self._early_exit:
            raise TunerExit()

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: Module) -> None:
        self.scale_batch_size(trainer, pl_module)
