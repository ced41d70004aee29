"""The files of ``ModelCheckpoint``: filling a name template, removing checkpoints, writing the
best-k list, and checking the callback's arguments (which checkpoints are complete, and the
newest: checkpoint/discovery.py)."""

from __future__ import annotations

import math
import numbers
import os
import re
import shutil
import warnings
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from fullshard.errors import MisconfigurationError

if TYPE_CHECKING:
    from fullshard.trainer.trainer import Trainer

# A field of a filename template: "{name}" or "{name:format_spec}". The name runs up to the
# first ":" or "}", so it may hold "/" or "." (logged names such as "val/loss").
_FIELD = re.compile(r"\{([^{}:]+)(:[^{}]*)?\}")


def fill_template(template: str, metrics: dict[str, Any], equals: str | None) -> str:
    """``template`` with each ``{name[:spec]}`` field filled from ``metrics`` (0 for a metric not
    logged yet, as in Lightning), written ``name<equals>value`` unless ``equals`` is None."""

    def fill(match: re.Match[str]) -> str:
        name, spec = match.group(1), (match.group(2) or ":")[1:]
        value = metrics.get(name, 0)
        if isinstance(value, torch.Tensor) and value.dim() == 0:
            value = value.item()
        try:
            text = format(value, spec)
        except ValueError as err:
            raise MisconfigurationError(
                f"ModelCheckpoint(filename={template!r}): cannot format {name!r} = {value!r} with "
                f"{{{name}:{spec}}} ({err}). Change the format spec, e.g. {{{name}:.4f}} for a float."
            ) from None
        return text if equals is None else name + equals + text

    return _FIELD.sub(fill, template)


def write_scores_yaml(filepath: str | os.PathLike[str], scores: dict[str, float]) -> None:
    """Write ``path: score`` lines as YAML (``{}`` when there are none)."""
    lines = [f"{_yaml_string(path)}: {_yaml_float(score)}\n" for path, score in scores.items()]
    Path(filepath).write_text("".join(lines) or "{}\n", encoding="utf-8")


def link_or_copy(filepath: str, linkpath: str) -> None:
    """Make ``linkpath`` a relative symbolic link to ``filepath``, or a copy where links fail."""
    remove_path(linkpath)
    try:
        os.symlink(os.path.relpath(filepath, os.path.dirname(linkpath)), linkpath)
    except OSError:
        warnings.warn(
            f"ModelCheckpoint(save_last='link'): cannot create a symbolic link at {linkpath!r}; "
            "copying the checkpoint instead.",
            stacklevel=3,
        )
        if os.path.isdir(filepath):
            shutil.copytree(filepath, linkpath)
        else:
            shutil.copy2(filepath, linkpath)


def remove_path(path: str) -> None:
    """Delete a checkpoint: a link (never its target), a file, or a sharded directory."""
    if os.path.islink(path) or os.path.isfile(path):
        os.remove(path)
    elif os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)


def removable(previous: str, current: str, resumed_from: str | None, dirpath: str | None) -> bool:
    """Whether a ModelCheckpoint may delete ``previous``: not when it is ``current``, the
    checkpoint this run resumed from (``resumed_from``), or outside ``dirpath`` (not ours)."""
    if previous == current:
        return False
    old = Path(previous).absolute()
    if resumed_from is not None and old == Path(resumed_from).absolute():
        return False
    assert dirpath is not None
    return Path(dirpath).absolute() in old.parents


def remove_once_committed(trainer: Trainer, paths: list[str]) -> None:
    """Delete ``paths`` on rank 0 once the checkpoints of the current save event are committed
    (see [Note: evicted files deleted after the commit] in model_checkpoint.py); collective."""

    def remove() -> None:
        if trainer.is_global_zero:
            for path in paths:
                remove_path(path)

    # a save written in the background (async_save) is committed later: delete then, not now
    if trainer.checkpoint_manager.after_commit(remove):
        return
    remove()
    trainer.strategy.barrier("model_checkpoint_remove")


def _yaml_string(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def _yaml_float(value: float) -> str:
    if math.isnan(value):
        return ".nan"
    if math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    return repr(value)


def check_arguments(
    *,
    dirpath: Any,
    filename: Any,
    monitor: Any,
    save_last: Any,
    save_top_k: Any,
    mode: Any,
    every_n_train_steps: Any,
    train_time_interval: Any,
    every_n_epochs: Any,
    save_on_train_epoch_end: Any,
    flags: dict[str, Any],
) -> None:
    def bad(name: str, value: Any, accepted: str) -> MisconfigurationError:
        return MisconfigurationError(f"ModelCheckpoint({name}={value!r}) is invalid: {accepted}.")

    def is_int(value: Any) -> bool:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)

    if dirpath is not None:
        if not isinstance(dirpath, str | os.PathLike):
            raise bad("dirpath", dirpath, "use a local directory path (str or pathlib.Path), or None")
        if "://" in os.fspath(dirpath):
            raise bad("dirpath", dirpath, "only local directories are supported; pass a local path")
    if filename is not None and (not isinstance(filename, str) or not filename):
        raise bad("filename", filename, "use a name template such as '{epoch}-{val_loss:.2f}', or None")
    if monitor is not None and (not isinstance(monitor, str) or not monitor):
        raise bad("monitor", monitor, "use the name of a logged metric, or None")
    if not (save_last is None or isinstance(save_last, bool) or save_last == "link"):
        raise bad("save_last", save_last, "use True, False, None or 'link'")
    if not is_int(save_top_k) or save_top_k < -1:
        raise bad("save_top_k", save_top_k, "use -1 (keep all), 0 (none besides last) or k >= 1")
    if monitor is None and save_top_k not in (-1, 0, 1):
        raise MisconfigurationError(
            f"ModelCheckpoint(save_top_k={save_top_k}, monitor=None) is invalid, as in Lightning: without a "
            "monitored metric there is nothing to rank the checkpoints by, so only -1 (keep all), 0 and 1 (keep "
            f"the newest) are accepted. Pass monitor='<logged metric>' to keep the best {save_top_k}, or "
            f"monitor='step', mode='max' to keep the {save_top_k} newest."
        )
    if mode not in ("min", "max"):
        raise bad("mode", mode, "use 'min' or 'max'")
    for name, value in (("every_n_train_steps", every_n_train_steps), ("every_n_epochs", every_n_epochs)):
        if value is not None and (not is_int(value) or value < 0):
            raise bad(name, value, "use a positive int, or 0/None to disable it")
    if train_time_interval is not None and (
        not isinstance(train_time_interval, timedelta) or train_time_interval < timedelta(0)
    ):
        raise bad("train_time_interval", train_time_interval, "use a datetime.timedelta >= 0, or None")
    if save_on_train_epoch_end is not None and not isinstance(save_on_train_epoch_end, bool):
        raise bad("save_on_train_epoch_end", save_on_train_epoch_end, "use True, False or None")
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise bad(name, value, "use True or False")
    triggers = {
        "every_n_train_steps": every_n_train_steps if every_n_train_steps else None,
        "every_n_epochs": every_n_epochs if every_n_epochs else None,
        "train_time_interval": train_time_interval,
    }
    given = {k: v for k, v in triggers.items() if v is not None}
    if len(given) > 1:
        listed = ", ".join(f"{k}={v!r}" for k, v in given.items())
        raise MisconfigurationError(
            f"ModelCheckpoint({listed}): pass only one of every_n_train_steps, every_n_epochs and "
            "train_time_interval. To save on several schedules, use one ModelCheckpoint for each."
        )


def default_dirpath(trainer: Trainer) -> str:
    """Where a ModelCheckpoint without ``dirpath`` saves: under the first logger's
    ``save_dir/name/version`` (:func:`~fullshard.trainer.loggers.checkpoint_root`), else under
    ``default_root_dir``."""
    from fullshard.trainer.loggers.dispatch import checkpoint_root

    return os.path.join(checkpoint_root(trainer.loggers, trainer.default_root_dir), "checkpoints")


def validates_after_epoch(trainer: Trainer) -> bool:
    """Whether a validation run is expected after the current (last) batch of the epoch."""
    if not sum(trainer.num_val_batches):
        return False
    every = trainer.check_val_every_n_epoch
    return every is None or (trainer.current_epoch + 1) % every == 0
