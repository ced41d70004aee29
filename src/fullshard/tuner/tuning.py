"""``Tuner``: the learning rate finder and the batch size finder, run through a Trainer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from fullshard.errors import MisconfigurationError
from fullshard.tuner.callbacks.batch_size_finder import BatchSizeFinder
from fullshard.tuner.callbacks.lr_finder import LearningRateFinder

if TYPE_CHECKING:
    from fullshard.datamodule import DataModule
    from fullshard.module import Module
    from fullshard.trainer.trainer import Trainer
    from fullshard.tuner.lr_finder import LRFinder

_METHODS = ("fit", "validate", "test", "predict")


def _check_loaders(train: Any, val: Any, dataloaders: Any, method: str) -> None:
    if method not in _METHODS:
        raise ValueError(f"method={method!r}: use one of {_METHODS}.")
    if method == "fit" and dataloaders is not None:
        raise MisconfigurationError(
            "With method='fit' the tuner takes train_dataloaders and val_dataloaders, not dataloaders."
        )
    if method != "fit" and (train is not None or val is not None):
        raise MisconfigurationError(
            f"With method={method!r} the tuner takes dataloaders, not train_dataloaders/val_dataloaders."
        )


class Tuner:
    """Finds a learning rate or a batch size by short trial runs of ``trainer``, then leaves the
    model and the Trainer as they were (the model's learning rate or batch size attribute set
    to what was found), as Lightning's ``Tuner``::

        tuner = Tuner(trainer)
        finder = tuner.lr_find(model)          # sets model.lr (or model.learning_rate)
        batch_size = tuner.scale_batch_size(model)
        trainer.fit(model)
    """

    def __init__(self, trainer: Trainer) -> None:
        self._trainer = trainer

    def lr_find(
        self,
        model: Module,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        dataloaders: Any = None,
        datamodule: DataModule | None = None,
        method: Literal["fit", "validate", "test", "predict"] = "fit",
        min_lr: float = 1e-8,
        max_lr: float = 1,
        num_training: int = 100,
        mode: str = "exponential",
        early_stop_threshold: float | None = 4.0,
        update_attr: bool = True,
        attr_name: str = "",
    ) -> LRFinder | None:
        """Train ``num_training`` steps with the learning rate growing from ``min_lr`` to
        ``max_lr`` (``mode``: ``"exponential"`` or ``"linear"``), stopping early when the loss
        exceeds ``early_stop_threshold`` times its best (None: never). Returns the finder
        (``results``, ``suggestion()``, ``plot()``); with ``update_attr`` the suggestion is set
        on the model's ``lr``/``learning_rate`` (or ``attr_name``).

        Raises:
            MisconfigurationError: for a ``method`` other than ``"fit"``, dataloaders that do not
                fit the method, or more than one optimizer.
            ValueError: when the Trainer has a ``LearningRateFinder`` callback already.
        """
        if method != "fit":
            raise MisconfigurationError(
                f"lr_find(method={method!r}): the learning rate finder trains, use method='fit'."
            )
        _check_loaders(train_dataloaders, val_dataloaders, dataloaders, method)
        trainer = self._trainer
        if any(isinstance(cb, LearningRateFinder) for cb in trainer.callbacks):
            raise ValueError(
                "The Trainer has a LearningRateFinder callback already; remove it to use Tuner.lr_find (or use only the "
                "callback)."
            )
        finder = LearningRateFinder(
            min_lr=min_lr,
            max_lr=max_lr,
            num_training_steps=num_training,
            mode=mode,
            early_stop_threshold=early_stop_threshold,
            update_attr=update_attr,
            attr_name=attr_name,
            early_exit=True,
        )
        trainer.callbacks = [finder, *trainer.callbacks]
        try:
            trainer.fit(model, train_dataloaders, val_dataloaders, datamodule)
        finally:
            trainer.callbacks = [cb for cb in trainer.callbacks if cb is not finder]
        return finder.optimal_lr

    def scale_batch_size(
        self,
        model: Module,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        dataloaders: Any = None,
        datamodule: DataModule | None = None,
        method: Literal["fit", "validate", "test", "predict"] = "fit",
        mode: str = "power",
        steps_per_trial: int = 3,
        init_val: int = 2,
        max_trials: int = 25,
        batch_arg_name: str = "batch_size",
        margin: float = 0.05,
        max_val: int = 8192,
    ) -> int | None:
        """Grow the batch size (the model's or DataModule's ``batch_arg_name``, which their
        ``*_dataloader()`` methods read) from ``init_val``, ``steps_per_trial`` steps a trial:
        doubling (``mode="power"``), then halving back on out-of-memory; or doubling and then a
        binary search (``"binsearch"``, with ``margin`` taken off the result). Returns the batch
        size found, also set on the model.

        Raises:
            MisconfigurationError: for dataloaders that do not fit ``method``, or dataloaders
                passed directly (the finder must be able to rebuild them).
            ValueError: for an unknown ``method`` or ``mode``, a ``margin`` outside [0, 1), or a
                Trainer that has a ``BatchSizeFinder`` callback already.
        """
        _check_loaders(train_dataloaders, val_dataloaders, dataloaders, method)
        if method != "fit":
            raise MisconfigurationError(
                f"scale_batch_size(method={method!r}): fullshard's batch size finder searches with training steps; "
                "use method='fit'."
            )
        trainer = self._trainer
        if any(isinstance(cb, BatchSizeFinder) for cb in trainer.callbacks):
            raise ValueError(
                "The Trainer has a BatchSizeFinder callback already; remove it to use Tuner.scale_batch_size."
            )
        finder = BatchSizeFinder(
            mode=mode,
            steps_per_trial=steps_per_trial,
            init_val=init_val,
            max_trials=max_trials,
            batch_arg_name=batch_arg_name,
            margin=margin,
            max_val=max_val,
            early_exit=True,
        )
        trainer.callbacks = [finder, *trainer.callbacks]
        try:
            trainer.fit(model, train_dataloaders, val_dataloaders, datamodule)
        finally:
            trainer.callbacks = [cb for cb in trainer.callbacks if cb is not finder]
        return finder.optimal_batch_size
