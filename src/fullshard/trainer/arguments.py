"""Checking the Trainer's arguments once, before any process starts."""

from __future__ import annotations

import difflib
import math
from typing import Any

from fullshard.errors import MisconfigurationError
from fullshard.trainer.data import limit_batches

# Lightning Trainer options fullshard does not implement, with the value that means "off" in
# Lightning: passing that value is accepted (a ported script often spells defaults out).
_LIGHTNING_ONLY: dict[str, tuple[Any, str]] = {
    "profiler": (None, "profile with torch.profiler inside a callback instead"),
    "barebones": (False, "fullshard's Trainer is lean already; leave it out"),
    "plugins": (None, "pass precision= and strategy= instead"),
    "sync_batchnorm": (False, "convert the model with torch.nn.SyncBatchNorm.convert_sync_batchnorm()"),
    "reload_dataloaders_every_n_epochs": (0, "build the dataset so that it changes per epoch"),
    "overfit_batches": (0.0, "use limit_train_batches=N with a loader that does not shuffle"),
    "max_time": (None, "use max_steps or max_epochs"),
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
)  # fmt: skip


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


def check_counts(**values: Any) -> None:
    """Each value is an int >= 1."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise MisconfigurationError(f"{name}={value!r} is invalid: use an int >= 1.")


def check_optional_count(name: str, value: Any, minimum: int) -> None:
    """``value`` is None or an int >= ``minimum``."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
        raise MisconfigurationError(f"{name}={value!r} is invalid: use None or an int >= {minimum}.")


def check_limits(**limits: Any) -> None:
    """Each ``limit_*_batches`` is a fraction in [0, 1] or a count."""
    for name, limit in limits.items():
        limit_batches(limit, math.inf if isinstance(limit, int) else 1, name)


def check_val_check_interval(value: Any) -> None:
    """A fraction of an epoch in (0, 1] or a number of batches."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise MisconfigurationError(
            f"val_check_interval={value!r} is invalid: use a fraction of an epoch in (0.0, 1.0] "
            "or a number of training batches (int >= 1)."
        )
    if isinstance(value, float) and value > 1.0:
        raise MisconfigurationError(
            f"val_check_interval={value} is a float above 1.0; a float is a fraction of the epoch. "
            f"For a number of batches pass an int, e.g. val_check_interval={int(value)}."
        )


def check_clipping(value: Any, algorithm: Any) -> None:
    """``gradient_clip_val`` and ``gradient_clip_algorithm``."""
    if algorithm not in ("norm", "value"):
        raise MisconfigurationError(
            f"gradient_clip_algorithm={algorithm!r} is invalid: use 'norm' or 'value'."
        )
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value < 0):
        raise MisconfigurationError(
            f"gradient_clip_val={value!r} is invalid: use a number > 0, or 0/None for no clipping."
        )


def fast_dev_run_batches(value: Any) -> int:
    """``fast_dev_run`` as a number of batches (0: off)."""
    if isinstance(value, bool):
        return int(value)
    if not isinstance(value, int) or value < 0:
        raise MisconfigurationError(
            f"fast_dev_run={value!r} is invalid: use True (one batch), False, or a number of batches >= 0."
        )
    return value


def check_deterministic(value: Any) -> None:
    """None, a bool, or ``"warn"``."""
    if value is not None and not isinstance(value, bool) and value != "warn":
        raise MisconfigurationError(
            f"deterministic={value!r} is invalid: use True, False, 'warn' (warn instead of raising on "
            "non-deterministic operations) or None."
        )
