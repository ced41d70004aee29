"""The Trainer's loggers: ``Trainer(logger=...)`` as a list, with Lightning's default logger
(the concern of Lightning's logger connector)."""

from __future__ import annotations

from collections.abc import Iterable

from fullshard.rank_zero import rank_zero_warn
from fullshard.trainer.argument_types import check_directory, logger_list
from fullshard.trainer.loggers.base import Logger, importable
from fullshard.trainer.loggers.csv_logger import CSVLogger
from fullshard.trainer.loggers.files import VersionedLogger
from fullshard.trainer.loggers.tensorboard import TensorBoardLogger


def build_loggers(logger: Logger | Iterable[Logger] | bool | None, default_root_dir: str) -> list[Logger]:
    """``Trainer(logger=...)`` as a list. True/None: the default logger (:func:`default_logger`).
    A logger need not derive from :class:`Logger`: as in Lightning, any object with its methods
    (``log_metrics``, ``log_hyperparams``, ``log_graph``, ``save``, ``finalize``,
    ``after_save_checkpoint``) and properties (``name``, ``version``, ``save_dir``) is accepted."""
    if logger is None or logger is True:
        return [default_logger(default_root_dir)]
    if logger is False:
        return []
    loggers = logger_list(logger)
    for item in loggers:  # the loggers that write files under a directory of their own
        if isinstance(item, VersionedLogger):
            check_directory(f"{type(item).__name__}(save_dir=)", item.root_dir)
    return loggers


def default_logger(default_root_dir: str) -> Logger:
    """Lightning's default logger: a ``TensorBoardLogger`` in ``default_root_dir/lightning_logs``
    when ``tensorboard`` is importable, else a ``CSVLogger`` there, with a warning saying so.
    (Lightning also takes ``tensorboardX`` alone; fullshard's TensorBoardLogger writes through
    ``torch.utils.tensorboard``, which needs ``tensorboard``.)"""
    if importable("tensorboard"):
        return TensorBoardLogger(default_root_dir)
    rank_zero_warn(
        "`logger=True` uses a `CSVLogger` as the default logger, as the `tensorboard` package is not installed. "
        'Install it (pip install "fullshard[tensorboard]") to log to TensorBoard by default, or pass '
        "`logger=CSVLogger(...)` to choose the CSV logger and silence this warning."
    )
    return CSVLogger(default_root_dir)
