"""The loops' settings, read once from the Trainer's arguments: how long to train, how many
batches of each stage, when to validate, log and clip, and what ``barebones``,
``fast_dev_run`` and ``overfit_batches`` change in them (the concern of Lightning's data
connector and debugging flags). The Trainer keeps them as its public attributes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fullshard.trainer import arguments
from fullshard.trainer.loggers.base import DummyLogger

# What Trainer(barebones=True) turns off, as Lightning: log_every_n_steps keeps its default, since
# nothing is logged.
_BAREBONES_SETTINGS: dict[str, Any] = {
    "enable_checkpointing": False,
    "logger": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "num_sanity_val_steps": 0,
    "log_every_n_steps": None,
}


def apply_barebones(given: Mapping[str, Any]) -> dict[str, Any]:
    """The Trainer's arguments (``given``: by name) as ``barebones=True`` leaves them, once
    :func:`arguments.check_barebones` accepted them; ``given`` as it is without barebones."""
    if not given["barebones"]:
        return dict(given)
    arguments.check_barebones(dict(given))
    return {**given, **_BAREBONES_SETTINGS}


@dataclass(frozen=True)
class LoopSettings:
    """The Trainer's loop arguments, checked and with their defaults and debug modes applied."""

    fast_dev_run: int
    overfit_batches: int | float
    reload_dataloaders_every_n_epochs: int
    limit_train_batches: int | float
    limit_val_batches: int | float
    limit_test_batches: int | float
    limit_predict_batches: int | float
    max_steps: int
    max_epochs: int
    min_epochs: int | None
    min_steps: int | None
    val_check_interval: int | float
    check_val_every_n_epoch: int | None
    num_sanity_val_steps: int
    accumulate_grad_batches: int
    gradient_clip_val: int | float | None
    gradient_clip_algorithm: str
    log_every_n_steps: int


def loop_settings(given: Mapping[str, Any]) -> LoopSettings:
    """Checks the loop arguments among ``given`` (the Trainer's arguments by name, barebones
    applied) and fills in Lightning's defaults; ``fast_dev_run`` runs that many batches of each
    stage in one epoch, with no sanity check; ``overfit_batches`` trains and validates on that
    many batches."""
    fast_dev_run = arguments.fast_dev_run_batches(given["fast_dev_run"])
    log_every_n_steps = 50 if given["log_every_n_steps"] is None else given["log_every_n_steps"]
    arguments.check_counts(
        accumulate_grad_batches=given["accumulate_grad_batches"],
        log_every_n_steps=log_every_n_steps,
    )
    gradient_clip_algorithm = arguments.clip_algorithm(given["gradient_clip_algorithm"])
    loop = {
        name: given[name]
        for name in (
            "max_steps",
            "max_epochs",
            "min_epochs",
            "min_steps",
            "check_val_every_n_epoch",
            "num_sanity_val_steps",
            "val_check_interval",
            "gradient_clip_val",
        )
    }
    arguments.check_loop_arguments(**loop, gradient_clip_algorithm=gradient_clip_algorithm)
    limits = arguments.batch_limits(
        given["limit_train_batches"],
        given["limit_val_batches"],
        given["limit_test_batches"],
        given["limit_predict_batches"],
    )
    if fast_dev_run:
        limits = dict.fromkeys(limits, fast_dev_run)
        loop.update(max_steps=fast_dev_run, max_epochs=1, num_sanity_val_steps=0)
        loop.update(val_check_interval=1.0, check_val_every_n_epoch=1)
    overfit_batches = given["overfit_batches"]
    if overfit_batches:  # as in Lightning: as many training as validation batches, in order
        limits.update(limit_train_batches=overfit_batches, limit_val_batches=overfit_batches)
    return LoopSettings(
        fast_dev_run=fast_dev_run,
        overfit_batches=overfit_batches,
        reload_dataloaders_every_n_epochs=given["reload_dataloaders_every_n_epochs"],
        limit_train_batches=limits["limit_train_batches"],
        limit_val_batches=limits["limit_val_batches"],
        limit_test_batches=limits["limit_test_batches"],
        limit_predict_batches=limits["limit_predict_batches"],
        max_steps=loop["max_steps"],
        max_epochs=arguments.default_max_epochs(
            loop["max_epochs"], loop["max_steps"], given["max_time"], given["callbacks"]
        ),
        min_epochs=loop["min_epochs"],
        min_steps=loop["min_steps"],
        # None: once an epoch
        val_check_interval=1.0 if loop["val_check_interval"] is None else loop["val_check_interval"],
        check_val_every_n_epoch=loop["check_val_every_n_epoch"],
        num_sanity_val_steps=2 if loop["num_sanity_val_steps"] is None else loop["num_sanity_val_steps"],
        accumulate_grad_batches=given["accumulate_grad_batches"],
        gradient_clip_val=loop["gradient_clip_val"] or None,
        gradient_clip_algorithm=gradient_clip_algorithm,
        log_every_n_steps=log_every_n_steps,
    )


def run_logger(logger: Any, fast_dev_run: int) -> Any:
    """The ``logger`` argument as ``fast_dev_run`` leaves it: as in Lightning, a stand-in that
    writes nothing, so that user code calling ``self.logger`` runs."""
    if not fast_dev_run:
        return logger
    return DummyLogger() if logger is not False and logger != [] else False
