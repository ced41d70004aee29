"""What the Trainer sends its loggers: the run's hyperparameters and graph when a call starts,
logged values, and the end of the call. All from global rank 0 only."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch

from fullshard.hyperparameters import sent_to_loggers
from fullshard.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from fullshard.datamodule import DataModule
    from fullshard.module import Module
    from fullshard.trainer.loggers.base import Logger
    from fullshard.trainer.trainer import Trainer


def run_hyperparams(model: Module, datamodule: DataModule | None) -> dict[str, Any] | None:
    """The hyperparameters a call logs: those the module and the datamodule recorded with
    ``save_hyperparameters`` (None when neither did).

    Raises:
        RuntimeError: a name both recorded, with different values.
    """
    # Only what save_hyperparameters recorded, and not with logger=False (Lightning's rule).
    from_module = dict(model.hparams_initial) if sent_to_loggers(model) else None
    from_data = (
        dict(datamodule.hparams_initial) if datamodule is not None and sent_to_loggers(datamodule) else {}
    )
    if from_module is None and not from_data:
        return None
    merged = dict(from_module or {})
    clashing = [
        key
        for key in merged.keys() & from_data.keys()
        if key != "_class_path" and not _same(merged[key], from_data[key])
    ]
    if clashing:
        raise RuntimeError(
            f"The module's and the datamodule's hyperparameters both have {sorted(clashing)}, with different "
            "values, so the loggers cannot be given one set. Rename one of them, or record it only once."
        )
    merged.update(from_data)
    merged.pop("_class_path", None)  # LightningCLI's record of the class, not a hyperparameter
    return merged


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a is b
    return bool(a == b)


def log_run_start(trainer: Trainer, model: Module, datamodule: DataModule | None) -> None:
    """When a call starts (``Trainer(enable_autolog_hparams=True)``): each logger gets the
    hyperparameters (when the module or datamodule recorded some), the module's graph, and a
    save; on global rank 0 only."""
    _agree_on_versions(trainer)
    if not trainer.loggers or not trainer.enable_autolog_hparams:
        return
    hparams = run_hyperparams(model, datamodule)
    if not trainer.is_global_zero:
        return
    # Tracing the graph runs forward on rank 0 alone: a sharded module would wait for the
    # other ranks' shards forever.
    sharded = trainer.strategy.shards_parameters
    for logger in trainer.loggers:
        if hparams is not None:
            logger.log_hyperparams(hparams)
        if getattr(logger, "_log_graph", False) and sharded:
            rank_zero_warn(
                f"{type(logger).__name__}(log_graph=True) logs no graph under {type(trainer.strategy).__name__}: "
                "tracing would run forward on one process while the parameters are sharded over all of them. "
                "Log it from a single-device or ddp run."
            )
        else:
            logger.log_graph(model)
        logger.save()


def _agree_on_versions(trainer: Trainer) -> None:
    """Give every process rank 0's version of each file-based logger (collective), so that
    ``logger.log_dir`` names the one run folder on every rank (see ``VersionedLogger.use_version``)."""
    from fullshard.trainer.loggers.files import VersionedLogger

    loggers = [lg for lg in trainer.loggers if isinstance(lg, VersionedLogger)]
    if trainer.world_size == 1 or not loggers:
        return
    versions = trainer.strategy.broadcast([lg.version if trainer.is_global_zero else None for lg in loggers])
    for logger, version in zip(loggers, versions, strict=True):
        logger.use_version(version)


def send_to_loggers(
    trainer: Trainer, values: dict[str, float], step: int, *, evaluation_step: bool = False
) -> None:
    """Send ``values`` to the Trainer's loggers at ``step``, from global rank 0.

    As Lightning's: a logged ``"step"`` value is the step the loggers get (it is taken out of the
    values, and no ``epoch`` is added); otherwise the current ``epoch`` is added unless the
    values have one. The rows of validation/test steps (``evaluation_step``) are sent as they are,
    at the count of batches the loop has logged.
    """
    if not (trainer.is_global_zero and trainer.loggers):
        return
    values = dict(values)
    if not evaluation_step:
        if "step" in values:
            step = int(values.pop("step"))
        else:
            values.setdefault("epoch", trainer.current_epoch)  # an int, as Lightning sends it
    for logger in trainer.loggers:
        logger.log_metrics(values, step=step)


def finalize_loggers(trainer: Trainer, status: str) -> None:
    """Tell the Trainer's loggers that the run ended (``status``: ``"success"`` or ``"failed"``),
    from global rank 0."""
    if trainer.is_global_zero:
        for logger in trainer.loggers:
            logger.finalize(status)


def run_dir(loggers: list[Logger], default_root_dir: str) -> str:
    """``trainer.log_dir``: the first logger's ``log_dir`` for a CSV or TensorBoard logger, else
    (the trackers, a logger of the user's own) its ``save_dir``, as Lightning; ``default_root_dir``
    when that is None."""
    from fullshard.trainer.loggers.files import VersionedLogger

    if not loggers:
        return default_root_dir
    logger = loggers[0]
    if isinstance(logger, VersionedLogger):
        return logger.log_dir
    return logger.save_dir or default_root_dir


def checkpoint_root(loggers: list[Logger], default_root_dir: str) -> str:
    """Where a ``ModelCheckpoint`` without ``dirpath`` saves: ``save_dir/name/version`` of the first
    logger (``version_N`` for an integer version; for the CSV and TensorBoard loggers, their
    ``log_dir`` without a ``sub_dir``), or ``default_root_dir``; ``/checkpoints`` is added by
    the callback."""
    if not loggers:
        return default_root_dir
    logger = loggers[0]
    version = logger.version
    folder = version if isinstance(version, str) else f"version_{version}"
    return os.path.join(logger.save_dir or default_root_dir, str(logger.name or ""), folder)
