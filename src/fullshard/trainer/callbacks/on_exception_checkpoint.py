"""``OnExceptionCheckpoint``: a checkpoint written when ``fit`` (or another stage) raises."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from typing_extensions import override

from fullshard.errors import RankDivergenceError
from fullshard.rank_zero import rank_zero_warn
from fullshard.trainer.callbacks.base import Checkpoint

if TYPE_CHECKING:
    from fullshard.module import Module
    from fullshard.trainer.trainer import Trainer


def fit_resume_path(trainer: Trainer, ckpt_path: str | Path | None) -> str | Path | None:
    """Lightning's rule: ``fit()`` without ``ckpt_path`` in a Trainer with an
    :class:`OnExceptionCheckpoint` resumes from ``"last"`` (the on-exception checkpoint a failed
    run left, or a ModelCheckpoint's newest), saying so."""
    if ckpt_path is not None or not any(isinstance(cb, OnExceptionCheckpoint) for cb in trainer.callbacks):
        return ckpt_path
    rank_zero_warn(
        "Trainer.fit() without ckpt_path, with an OnExceptionCheckpoint callback, resumes from the newest "
        "checkpoint (ckpt_path='last'): the one a failed run left, else a ModelCheckpoint's, as Lightning does. "
        "Pass ckpt_path (a path, 'last' or 'best') to choose, which also silences this warning."
    )
    return "last"


class OnExceptionCheckpoint(Checkpoint):
    """Saves ``<dirpath>/<filename>.ckpt`` with ``trainer.save_checkpoint`` when the run raises
    (a ``KeyboardInterrupt`` included), so that training can resume from where it failed. A run
    that ends without an error removes the file an earlier failure left, as Lightning does.

    Saving is collective: in a multi-process run every process must raise (as a
    ``KeyboardInterrupt``, a signal to the job, or an error every rank meets at the same step
    do). The processes first check that they all failed; when one did not (it is still inside a
    collective), nothing is saved and a warning says so, instead of waiting for it forever.

    A :class:`Checkpoint`, as in Lightning: with it in ``callbacks`` the Trainer adds no default
    ``ModelCheckpoint``, and it acts after the other callbacks.

    Args:
        dirpath: the directory of the checkpoint (made when needed).
        filename: its name without ``.ckpt``.

    Raises:
        ValueError: for an empty ``filename``.
    """

    FILE_EXTENSION = ".ckpt"

    def __init__(self, dirpath: str | os.PathLike[str], filename: str = "on_exception") -> None:
        if not filename:
            raise ValueError(
                "OnExceptionCheckpoint(filename=''): give the checkpoint a name, e.g. 'on_exception'."
            )
        self.dirpath = dirpath
        self.filename = filename
        self._saved = False

    @property
    def ckpt_path(self) -> str:
        """Where the checkpoint is written."""
        return os.path.join(self.dirpath, self.filename + self.FILE_EXTENSION)

    @override
    def newest_checkpoint(self) -> str | None:
        return self.ckpt_path if Path(self.ckpt_path).is_file() else None

    @override
    def setup(self, trainer: Trainer, pl_module: Module, stage: str) -> None:
        self._saved = False

    @override
    def on_exception(self, trainer: Trainer, pl_module: Module, exception: BaseException) -> None:
        strategy = trainer.strategy
        if trainer.world_size > 1:
            try:  # every rank must be here: the save is collective
                strategy.check_rank_agreement(
                    "on_exception_checkpoint", "failed", "a process raised, so OnExceptionCheckpoint saves"
                )
            except RankDivergenceError:
                rank_zero_warn(
                    f"OnExceptionCheckpoint did not save {self.ckpt_path}: not every process raised, and saving needs "
                    "them all."
                )
                return
        if strategy.module is None:
            return  # the failure came before the model was set up: nothing to save
        trainer.save_checkpoint(self.ckpt_path)
        trainer.checkpoint_manager.wait()  # written before the error propagates
        self._saved = True

    @override
    def teardown(self, trainer: Trainer, pl_module: Module, stage: str) -> None:
        if self._saved:
            return  # teardown also runs after a failure: keep the checkpoint just written
        if trainer.is_global_zero and Path(self.ckpt_path).is_file():
            os.remove(self.ckpt_path)
