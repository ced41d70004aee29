"""Checking the Trainer's arguments once, before any process starts, and resolving the strategy
they name. The callbacks and loggers they name are built in callback_setup.py and
logger_setup.py, the loop settings in loop_settings.py."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterator, Mapping
from typing import Any

from fullshard.errors import MisconfigurationError, MisconfigurationTypeError
from fullshard.rank_zero import rank_zero_info
from fullshard.strategies import STRATEGY_REGISTRY, Strategy
from fullshard.trainer.argument_types import (
    callback_list,
    check_directory,
    check_flag,
    check_int,
    check_number,
    logger_list,
)
from fullshard.trainer.callbacks.base import Callback
from fullshard.trainer.callbacks.timer import Timer
from fullshard.trainer.data import limit_batches

# Lightning Trainer options fullshard does not implement, with the value that means "off" in
# Lightning: passing that value is accepted (a ported script often spells defaults out).
_LIGHTNING_ONLY: dict[str, tuple[Any, str]] = {
    "model_registry": (None, "leave it out"),
}

TRAINER_ARGUMENTS = (
    "accelerator", "strategy", "devices", "num_nodes", "precision", "logger", "callbacks", "fast_dev_run",
    "max_epochs", "min_epochs", "max_steps", "min_steps", "limit_train_batches", "limit_val_batches",
    "limit_test_batches", "limit_predict_batches", "val_check_interval", "check_val_every_n_epoch",
    "num_sanity_val_steps", "log_every_n_steps", "enable_checkpointing", "enable_progress_bar",
    "enable_model_summary", "accumulate_grad_batches", "gradient_clip_val", "gradient_clip_algorithm",
    "deterministic", "benchmark", "inference_mode", "use_distributed_sampler", "detect_anomaly",
    "default_root_dir", "compile", "preemption_signals", "requeue_on_preemption", "on_nonfinite_loss",
    "max_consecutive_nonfinite_skips", "max_time", "profiler", "sync_batchnorm", "overfit_batches", "reload_dataloaders_every_n_epochs",
    "barebones", "enable_autolog_hparams", "plugins",
)  # fmt: skip

# Trainer(barebones=True), as Lightning: the options it turns off (each with its "off" value) and
# those it refuses to turn on.
_BAREBONES_OFF: tuple[tuple[str, Any, str], ...] = (
    ("enable_checkpointing", False, "Checkpointing"),
    ("logger", False, "Logging"),
    ("enable_progress_bar", False, "The progress bar"),
    ("log_every_n_steps", 0, "Logging"),
    ("enable_model_summary", False, "The model summary"),
    ("num_sanity_val_steps", 0, "Sanity checking"),
)
_BAREBONES_REFUSED: tuple[tuple[str, Any, str], ...] = (
    ("fast_dev_run", False, "A development run"),
    ("detect_anomaly", False, "Anomaly detection"),
    ("profiler", None, "Profiling"),
)


def check_barebones(given: dict[str, Any]) -> None:
    """``Trainer(barebones=True)`` with ``given`` (the Trainer's arguments by name): Lightning's rule.

    An option barebones turns off may be left at its default (None) or given its "off" value;
    turning one on, or turning on one it refuses (``fast_dev_run``, ``detect_anomaly``,
    ``profiler``), is a ``ValueError``.
    """
    for name, off, what in _BAREBONES_OFF:
        if given[name] is not None and given[name] != off:
            raise ValueError(
                f"Trainer(barebones=True, {name}={given[name]!r}) was passed. {what} can slow the loop down, so "
                f"barebones mode turns it off: leave {name} out, or drop barebones=True."
            )
    for name, off, what in _BAREBONES_REFUSED:
        if given[name] is not off and given[name] != off:
            raise ValueError(
                f"Trainer(barebones=True, {name}={given[name]!r}) was passed. {what} is off in barebones mode: "
                f"leave {name} out, or drop barebones=True."
            )
    rank_zero_info(
        "Trainer(barebones=True): checkpointing, logging (self.log does nothing), the progress bar, the model "
        "summary and the sanity check are off, to measure the loop's own speed."
    )


def reject_unknown(extra: dict[str, Any]) -> None:
    """Explain Trainer keyword arguments fullshard does not take."""
    for name, value in extra.items():
        if name in _LIGHTNING_ONLY:
            off, instead = _LIGHTNING_ONLY[name]
            if value == off:
                continue
            raise MisconfigurationError(
                f"Trainer({name}={value!r}) is a Lightning option that fullshard does not support; "
                f"{instead}. See docs/lightning.md for what is supported."
            )
        close = difflib.get_close_matches(name, TRAINER_ARGUMENTS, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise TypeError(
            f"Trainer() got an unexpected keyword argument {name!r}.{hint} Trainer takes: "
            f"{', '.join(TRAINER_ARGUMENTS)}."
        )


# ------------------------------------------------------------------ each argument on its own
# The Trainer's bool options, each with whether None (its default, "decide for me") is accepted.
_FLAGS: dict[str, bool] = {
    "enable_checkpointing": True,
    "enable_progress_bar": True,
    "enable_model_summary": True,
    "benchmark": True,
    "barebones": False,
    "inference_mode": False,
    "detect_anomaly": False,
    "sync_batchnorm": False,
    "requeue_on_preemption": False,
    "enable_autolog_hparams": False,
}


def check_each(given: Mapping[str, Any]) -> None:
    """The Trainer's arguments (``given``: by name) that can be checked one by one, before any
    other is read: the bool options, ``deterministic``, the data options, ``callbacks``,
    ``logger`` and ``default_root_dir``. Each refusal names the argument, the value, what is
    accepted and what to pass; nothing is built and nothing is written."""
    for name, optional in _FLAGS.items():
        check_flag(name, given[name], optional)
    check_deterministic(given["deterministic"])
    check_data_options(given["overfit_batches"], given["reload_dataloaders_every_n_epochs"])
    callbacks, logger = given["callbacks"], given["logger"]
    if not isinstance(callbacks, Iterator):  # a one-shot iterator is checked as it is read, later
        callback_list(callbacks)
    if logger is not None and not isinstance(logger, bool | Iterator):
        logger_list(logger)
    check_directory("Trainer(default_root_dir=)", given["default_root_dir"])


def check_epochs_and_steps(max_epochs: Any, min_epochs: Any, max_steps: Any, min_steps: Any) -> None:
    """A minimum above its maximum (``-1``: no maximum) could never be honoured: training stops
    at the maximum, and the minimum silently means nothing."""
    for kind, low, high in (("epochs", min_epochs, max_epochs), ("steps", min_steps, max_steps)):
        if low is not None and high is not None and high != -1 and low > high:
            raise MisconfigurationError(
                f"min_{kind}={low} is above max_{kind}={high}: training stops after {high} {kind}, so "
                f"min_{kind} could never be reached. Lower min_{kind} to {high} or less, or raise max_{kind} "
                f"(-1: no limit)."
            )


def check_counts(**values: Any) -> None:
    """Each value is an int >= 1."""
    for name, value in values.items():
        check_int(name, value, "an int >= 1")
        if value < 1:
            raise MisconfigurationError(f"{name}={value!r} is invalid: use an int >= 1.")


def check_optional_count(name: str, value: Any, minimum: int) -> None:
    """``value`` is None or an int >= ``minimum``."""
    if value is None:
        return
    check_int(name, value, f"None or an int >= {minimum}")
    if value < minimum:
        raise MisconfigurationError(f"{name}={value!r} is invalid: use None or an int >= {minimum}.")


_FRACTION_OR_COUNT = "a fraction in [0.0, 1.0] or a number of batches (int >= 0)"


def batch_limits(train: Any, val: Any, test: Any, predict: Any) -> dict[str, int | float]:
    """The ``limit_*_batches`` arguments, checked, by name (None: all batches, 1.0)."""
    limits = {
        "limit_train_batches": train,
        "limit_val_batches": val,
        "limit_test_batches": test,
        "limit_predict_batches": predict,
    }
    checked: dict[str, int | float] = {k: (1.0 if v is None else v) for k, v in limits.items()}
    check_limits(**checked)
    return checked


def check_limits(**limits: Any) -> None:
    """Each ``limit_*_batches`` is a fraction in [0, 1] or a count."""
    for name, limit in limits.items():
        check_number(name, limit, _FRACTION_OR_COUNT)
        limit_batches(limit, math.inf if isinstance(limit, int) else 1, name)


def check_val_check_interval(value: Any) -> None:
    """A fraction of an epoch in (0, 1] or a number of batches."""
    accepted = "a fraction of an epoch in (0.0, 1.0] or a number of training batches (int >= 1)"
    check_number("val_check_interval", value, accepted)
    if value <= 0:
        raise MisconfigurationError(f"val_check_interval={value!r} is invalid: use {accepted}.")
    if isinstance(value, float) and value > 1.0:
        raise MisconfigurationError(
            f"val_check_interval={value} is a float above 1.0; a float is a fraction of the epoch. "
            f"For a number of batches pass an int, e.g. val_check_interval={int(value)}."
        )


def clip_algorithm(algorithm: Any) -> str:
    """``gradient_clip_algorithm`` as ``"norm"`` (also for None, the default) or ``"value"``; as
    Lightning, in any case (``"Norm"``, ``GradClipAlgorithmType.VALUE``)."""
    if algorithm is None:
        return "norm"
    if not isinstance(algorithm, str):
        raise MisconfigurationTypeError(
            f"gradient_clip_algorithm={algorithm!r} is invalid: use 'norm' or 'value' (got {type(algorithm).__name__})."
        )
    return algorithm.lower()


def check_clipping(value: Any, algorithm: Any) -> None:
    """``gradient_clip_val`` and ``gradient_clip_algorithm`` (as :func:`clip_algorithm` gives it)."""
    if algorithm not in ("norm", "value"):
        raise MisconfigurationError(
            f"gradient_clip_algorithm={algorithm!r} is invalid: use 'norm' or 'value'."
        )
    if value is None:
        return
    accepted = "a number > 0, or 0/None for no clipping"
    check_number("gradient_clip_val", value, accepted)
    if value < 0:
        raise MisconfigurationError(f"gradient_clip_val={value!r} is invalid: use {accepted}.")


def fast_dev_run_batches(value: Any) -> int:
    """``fast_dev_run`` as a number of batches (0: off)."""
    if isinstance(value, bool):
        return int(value)
    accepted = "True (one batch), False, or a number of batches >= 0"
    check_int("fast_dev_run", value, accepted)
    if value < 0:
        raise MisconfigurationError(f"fast_dev_run={value!r} is invalid: use {accepted}.")
    return int(value)


def check_deterministic(value: Any) -> None:
    """None, a bool, or ``"warn"``."""
    if value is not None and not isinstance(value, bool) and value != "warn":
        raise MisconfigurationError(
            f"deterministic={value!r} is invalid: use True, False, 'warn' (warn instead of raising on "
            "non-deterministic operations) or None."
        )


def check_data_options(overfit_batches: Any, reload_every_n_epochs: Any) -> None:
    """``overfit_batches`` (a fraction or a count, as the ``limit_*_batches``) and
    ``reload_dataloaders_every_n_epochs`` (an int >= 0)."""
    check_limits(overfit_batches=overfit_batches)
    accepted = "an int >= 0 (0: never rebuild the dataloaders)"
    check_int("reload_dataloaders_every_n_epochs", reload_every_n_epochs, accepted)
    if reload_every_n_epochs < 0:
        raise MisconfigurationError(
            f"reload_dataloaders_every_n_epochs={reload_every_n_epochs!r} is invalid: use {accepted}."
        )


KEEP_SHUFFLE = "keep_shuffle"


def check_sampler_option(value: Any) -> bool | str:
    """``use_distributed_sampler``: True (Lightning's distributed sampler, which shuffles the
    training data under a distributed strategy), ``"keep_shuffle"`` (the same sampler, shuffling
    as the loader says) or False (the loaders as given)."""
    if value is True or value is False or value == KEEP_SHUFFLE:
        return value  # type: ignore[no-any-return]
    raise MisconfigurationError(
        f"use_distributed_sampler={value!r} is invalid: use True (Lightning's sampler: under a distributed "
        f"strategy it shuffles the training data, even from a loader with shuffle=False), {KEEP_SHUFFLE!r} "
        "(the same sampler, keeping the training loader's own order: shuffle= as you set it) or False (the "
        "loaders as given: split the data by rank yourself)."
    )


def default_max_epochs(max_epochs: int | None, max_steps: int, max_time: Any, callbacks: Any) -> int:
    """``max_epochs`` with Lightning's default: 1000, or no limit (-1) when ``max_steps`` or a
    time limit (``max_time``, a :class:`Timer` callback) ends training."""
    if max_epochs is not None:
        return max_epochs
    given = (
        [callbacks]
        if isinstance(callbacks, Callback)
        else list(callbacks)
        if isinstance(callbacks, list | tuple)
        else []
    )
    if max_steps == -1 and max_time is None and not any(isinstance(cb, Timer) for cb in given):
        return 1000
    return -1


def check_loop_arguments(
    *,
    max_steps: Any,
    max_epochs: Any,
    min_epochs: Any,
    min_steps: Any,
    check_val_every_n_epoch: Any,
    num_sanity_val_steps: Any,
    val_check_interval: int | float | None,
    gradient_clip_val: Any,
    gradient_clip_algorithm: str,
) -> None:
    """The Trainer's loop settings (``gradient_clip_algorithm`` with its default filled in;
    ``val_check_interval`` as given: None, once an epoch, also goes with
    ``check_val_every_n_epoch=None``, as in Lightning)."""
    check_int("max_steps", max_steps, "-1 (no limit) or an int >= 0")
    if max_steps < -1:
        raise MisconfigurationError(f"max_steps={max_steps!r} is invalid: use -1 (no limit) or an int >= 0.")
    if max_epochs is not None:
        check_int("max_epochs", max_epochs, "-1 (no limit) or an int >= 0")
        if max_epochs < -1:
            raise MisconfigurationError(
                f"max_epochs={max_epochs!r} is invalid: use -1 (no limit) or an int >= 0."
            )
    check_optional_count("min_epochs", min_epochs, 0)
    check_optional_count("min_steps", min_steps, 0)
    check_epochs_and_steps(max_epochs, min_epochs, max_steps, min_steps)
    check_optional_count("check_val_every_n_epoch", check_val_every_n_epoch, 1)
    if num_sanity_val_steps is not None:
        accepted = "an int >= 0, or -1 for the whole validation set"
        check_int("num_sanity_val_steps", num_sanity_val_steps, accepted)
        if num_sanity_val_steps < -1:
            raise MisconfigurationError(
                f"num_sanity_val_steps={num_sanity_val_steps!r} is invalid: use {accepted}."
            )
    check_clipping(gradient_clip_val, gradient_clip_algorithm)
    if val_check_interval is not None:
        check_val_check_interval(val_check_interval)
    if isinstance(val_check_interval, float) and check_val_every_n_epoch is None:
        raise MisconfigurationError(
            f"val_check_interval={val_check_interval} (a fraction of an epoch) needs "
            "check_val_every_n_epoch to be set; with check_val_every_n_epoch=None pass a number of "
            "batches (int)."
        )


def resolve_strategy(strategy: str | Strategy, world_size: int) -> Strategy:
    """The Strategy for ``Trainer(strategy=...)`` running ``world_size`` processes."""
    if isinstance(strategy, Strategy):
        resolved = strategy
    elif isinstance(strategy, str):
        if strategy == "auto":
            return STRATEGY_REGISTRY.get("single_device" if world_size == 1 else "ddp")
        resolved = STRATEGY_REGISTRY.get(strategy)
    else:
        raise MisconfigurationError(
            f"strategy must be a name or a fullshard.strategies.Strategy instance, got {type(strategy).__name__}. "
            f"Registered names: {', '.join(STRATEGY_REGISTRY.available())}."
        )
    if resolved.runs_in_one_process and world_size > 1:
        raise MisconfigurationError(
            f"strategy={resolved.strategy_name!r} runs one process, but {world_size} devices were requested. Use "
            "devices=1, or a multi-process strategy such as strategy='ddp'."
        )
    return resolved
