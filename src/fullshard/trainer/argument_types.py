"""What each Trainer argument's type may be, checked on its own: the bool options, numbers,
directories, and the callbacks and loggers given. Each refusal is a
:class:`~fullshard.errors.MisconfigurationTypeError` (a ``TypeError``, as Lightning's for the same
inputs where it has one) or, for a value of the right type out of range, a
:class:`~fullshard.errors.MisconfigurationError`; both name the argument, what was given, what is
accepted and what to pass."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fullshard.errors import MisconfigurationError, MisconfigurationTypeError
from fullshard.trainer.callbacks.base import Callback
from fullshard.trainer.loggers.base import Logger

_FALSE_WORDS = ("false", "no", "off", "0", "n", "none", "")


def check_flag(name: str, value: Any, optional: bool = False) -> None:
    """``value`` is True or False (or None, where ``optional``). Anything else is refused rather
    than read by its truth: ``enable_checkpointing="no"`` would otherwise turn checkpointing on."""
    if value is True or value is False or (optional and value is None):
        return
    accepted = "True or False" + (" (or None, the default)" if optional else "")
    if isinstance(value, str):
        meant = value.strip().lower() not in _FALSE_WORDS
        hint = (
            f"A string is not read as a bool (any non-empty one, {value!r} too, would count as True): "
            f"pass {name}={meant}."
        )
    else:
        hint = f"Pass {name}=True or {name}=False."
    raise MisconfigurationTypeError(f"{name}={value!r} is invalid: use {accepted}. {hint}")


def check_directory(where: str, path: Any) -> None:
    """``path`` (None: not given) names a directory, or a path one can be made at: the first part
    of it that exists is a directory. A file there would make the first log or checkpoint fail,
    after training ran. A URL (``s3://...``) is left to whoever writes it."""
    if path is None:
        return
    if not isinstance(path, str | os.PathLike):
        raise MisconfigurationTypeError(
            f"{where} got {path!r} ({type(path).__name__}): use a directory path, a str or a pathlib.Path."
        )
    text = os.fspath(path)
    if not isinstance(text, str) or "://" in text:
        return
    full = Path(os.path.abspath(os.path.expanduser(text)))
    for part in (full, *full.parents):
        if os.path.exists(part):  # os.path's checks read an unreadable path as absent, not raise
            if not os.path.isdir(part):
                raise MisconfigurationError(
                    f"{where} got {text!r}, but {str(part)!r} is a file, not a directory: the first log or "
                    "checkpoint written there would fail, after training ran. Pass a directory (an existing "
                    "one, or a new path, created when first written), or move the file away."
                )
            return


def callback_list(callbacks: Any) -> list[Callback]:
    """``Trainer(callbacks=)`` as a list: None, a Callback, or a list (tuple, any iterable but a
    string or a mapping) of Callbacks; the first item of another type is named."""
    if callbacks is None:
        return []
    if isinstance(callbacks, Callback):
        return [callbacks]
    if isinstance(callbacks, str | bytes | Mapping) or not isinstance(callbacks, Iterable):
        raise MisconfigurationTypeError(
            f"callbacks must be a fullshard Callback or a list of them, got {type(callbacks).__name__} "
            f"({_short(callbacks)}). Pass callbacks=[...] with fullshard.callbacks instances (a Lightning "
            "callback ports by changing its import), or leave callbacks out."
        )
    given = list(callbacks)
    for i, cb in enumerate(given):
        if not isinstance(cb, Callback):
            raise MisconfigurationTypeError(
                f"callbacks must be fullshard Callback instances, got {type(cb).__name__} at callbacks[{i}] "
                f"({_short(cb)}). Subclass fullshard.Callback (a Lightning callback ports by changing its "
                "import), or take it out of the list."
            )
    return given


def logger_list(logger: Any) -> list[Logger]:
    """``Trainer(logger=)`` other than a bool or None, as a list: a logger or an iterable of
    them. A logger need not derive from :class:`Logger`: as in Lightning, any object with its
    methods (``log_metrics``, ``log_hyperparams``, ...) and properties is accepted."""
    if isinstance(logger, str | bytes | Mapping):
        raise MisconfigurationTypeError(
            f"logger={logger!r} is invalid: use a fullshard Logger (CSVLogger, TensorBoardLogger, ...), a list "
            "of them, True or None (the default logger) or False (none). A string is not read as a bool."
        )
    single = isinstance(logger, Logger) or not isinstance(logger, Iterable)
    loggers = [logger] if single else list(logger)
    for i, item in enumerate(loggers):
        missing = [m for m in ("log_metrics", "log_hyperparams") if not callable(getattr(item, m, None))]
        if missing:
            at = "" if single else f" at logger[{i}]"
            raise MisconfigurationTypeError(
                f"logger must be a fullshard Logger (or an object with a Logger's methods, as Lightning "
                f"accepts), got {type(item).__name__}{at} ({_short(item)}), which has no "
                f"{' or '.join(missing)}. Pass a fullshard.loggers logger (CSVLogger, TensorBoardLogger, ...), a "
                "subclass of fullshard.loggers.Logger, a list of them, or False for none."
            )
    return loggers


def check_int(name: str, value: Any, accepted: str) -> None:
    """``value`` is an int (a bool is not: ``True`` is no count)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise MisconfigurationTypeError(
            f"{name}={value!r} is invalid: use {accepted} (got {type(value).__name__})."
        )


def check_number(name: str, value: Any, accepted: str) -> None:
    """``value`` is an int or a float other than NaN (a bool is not a number here)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MisconfigurationTypeError(
            f"{name}={value!r} is invalid: use {accepted} (got {type(value).__name__})."
        )
    if isinstance(value, float) and math.isnan(value):
        raise MisconfigurationError(f"{name}=nan is invalid: use {accepted}.")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
