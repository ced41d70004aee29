"""What ``save_hyperparameters`` records, for the Module and the DataModule (Lightning's rules).

Called in ``__init__``, it records the arguments of ``__init__`` (all of them, the ones named, or
all but ``ignore``), or one config object given to it: a dict, an ``argparse.Namespace`` or an
omegaconf ``DictConfig``, whose entries become the hyperparameters and whose argument's name is
kept (``hparams_name`` in checkpoints, so ``load_from_checkpoint`` passes them back as that one
argument). ``logger=False`` keeps them out of what the loggers get; they are still in ``hparams``
and in checkpoints. A ``DictConfig`` is stored as a plain dict (omegaconf is never imported:
it is recognised by its type's module), as checkpoints hold plain data only.
"""

from __future__ import annotations

import inspect
import sys
from argparse import Namespace
from collections.abc import Mapping
from types import FrameType
from typing import Any

_NAME_ATTRIBUTE = "_hparams_name"
_LOG_ATTRIBUTE = "_log_hyperparams"


def init_arguments(frame: FrameType, names: tuple[str, ...]) -> dict[str, Any]:
    """The arguments of the function running in ``frame`` (an ``__init__``), all of them or those
    in ``names``; what ``save_hyperparameters()`` records."""
    arguments = inspect.getargvalues(frame)
    local = {k: arguments.locals[k] for k in arguments.args if k != "self"}
    if arguments.keywords:
        local.update(arguments.locals.get(arguments.keywords, {}))
    unknown = [n for n in names if n not in local]
    if unknown:
        raise ValueError(
            f"save_hyperparameters got {unknown}, which are not arguments of the calling "
            f"function (it has {sorted(local)}). Pass argument names, or keyword values."
        )
    return {k: v for k, v in local.items() if not names or k in names}


def _is_dict_config(value: Any) -> bool:
    return type(value).__module__.startswith("omegaconf") and "omegaconf" in sys.modules


def _config_entries(config: Any) -> dict[str, Any]:
    """The entries of a config object given to ``save_hyperparameters``."""
    if isinstance(config, Namespace):
        return dict(vars(config))
    if _is_dict_config(config):
        container = sys.modules["omegaconf"].OmegaConf.to_container(config, resolve=True)
        return dict(container)
    if isinstance(config, Mapping):
        return dict(config)
    if isinstance(config, bool | int | float | str | bytes):
        raise ValueError(
            f"save_hyperparameters({config!r}): a single value cannot be the hyperparameters. Pass the names of "
            "__init__ arguments as strings, or a dict, argparse.Namespace or omegaconf DictConfig of them."
        )
    raise ValueError(
        f"save_hyperparameters got a {type(config).__name__}; it takes the names of __init__ arguments, or one "
        "dict, argparse.Namespace or omegaconf DictConfig."
    )


def record(
    owner: Any,
    frame: FrameType | None,
    args: tuple[Any, ...],
    ignore: str | list[str] | None,
    values: dict[str, Any],
    logger: bool,
) -> dict[str, Any] | None:
    """The hyperparameters ``save_hyperparameters(*args, ignore=, logger=, **values)`` called in
    ``frame`` records for ``owner`` (None: an empty config was given, nothing is recorded); the
    argument's name and ``logger`` are kept on ``owner`` for :func:`checkpoint_entries` and
    :func:`sent_to_loggers`."""
    setattr(owner, _LOG_ATTRIBUTE, logger)
    if len(args) == 1 and not isinstance(args[0], str) and not args[0]:
        return None  # an empty config, as Lightning: nothing recorded (the loggers get an empty set)
    ignored = {ignore} if isinstance(ignore, str) else set(ignore or ())
    names = tuple(a for a in args if isinstance(a, str))
    configs = [a for a in args if not isinstance(a, str)]
    name: str | None = None
    if len(configs) == 1:
        hparams = _config_entries(configs[0])
        init = init_arguments(frame, ()) if frame is not None else {}
        name = next((k for k, v in init.items() if v is configs[0]), None)
    else:
        hparams = init_arguments(frame, names) if frame is not None and not values else {}
        name = "kwargs" if hparams else None
    hparams = {k: v for k, v in hparams.items() if k not in ignored}
    hparams.update(values)
    setattr(owner, _NAME_ATTRIBUTE, name)
    return hparams


def checkpoint_entries(owner: Any, prefix: str = "") -> dict[str, Any]:
    """The checkpoint's record of how the hyperparameters were given (Lightning's
    ``hparams_name``, ``datamodule_hparams_name`` with ``prefix="datamodule_"``) when one config
    argument held them."""
    name = getattr(owner, _NAME_ATTRIBUTE, None)
    return {f"{prefix}hparams_name": name} if name not in (None, "kwargs") else {}


def sent_to_loggers(owner: Any) -> bool:
    """Whether ``owner``'s recorded hyperparameters go to the loggers (``logger=True``, the
    default; False when ``save_hyperparameters`` was never called)."""
    return bool(getattr(owner, _LOG_ATTRIBUTE, False))
