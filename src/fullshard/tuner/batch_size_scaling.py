"""The batch size finder: run a few steps at growing batch sizes until memory runs out (or the
limits are reached), as Lightning's ``scale_batch_size``."""

from __future__ import annotations

import gc
import logging
from typing import TYPE_CHECKING, Any

import torch

from fullshard.rank_zero import rank_zero_info, rank_zero_warn
from fullshard.tuner.lr_finder import _has_attr, _set_attr
from fullshard.tuner.search import Snapshot, rebuild_train_loader, rebuild_val_loaders, run_trial

if TYPE_CHECKING:
    from fullshard.module import Module
    from fullshard.trainer.trainer import Trainer

log = logging.getLogger(__name__)


def get_batch_size(module: Module, name: str) -> int:
    """The batch size the module (or its DataModule, or their hparams) holds under ``name``."""
    for owner in _owners(module):
        if hasattr(owner, name):
            return int(getattr(owner, name))
        if name in getattr(owner, "hparams", {}):
            return int(owner.hparams[name])
    raise AttributeError(name)


def _owners(module: Module) -> list[Any]:
    trainer = getattr(module, "_trainer", None)
    datamodule = getattr(trainer, "datamodule", None) if trainer is not None else None
    return [module] + ([datamodule] if datamodule is not None else [])


def has_batch_size(module: Module, name: str) -> bool:
    """Whether ``get_batch_size`` finds ``name``."""
    return any(_has_attr(owner, name) for owner in _owners(module))


def set_batch_size(module: Module, name: str, value: int) -> None:
    """Set ``name`` wherever the module and its DataModule hold it (as Lightning's setattr)."""
    for owner in _owners(module):
        if _has_attr(owner, name):
            _set_attr(owner, name, value)


def is_oom_error(error: BaseException) -> bool:
    """Whether ``error`` says a device (or the CPU allocator) ran out of memory."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and (
        "CUDA out of memory" in text
        or "CUDNN_STATUS_NOT_SUPPORTED" in text
        or "DefaultCPUAllocator: can't allocate" in text
    )


def _free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _dataset_length(trainer: Trainer, module: Module) -> int | None:
    loader = (
        trainer.data_sources.get("train", module) if trainer.data_sources is not None else None
    )  # the running fit's sources
    try:
        return len(loader.dataset)  # type: ignore[union-attr,arg-type]
    except (AttributeError, TypeError):
        return None


def _adjust(
    trainer: Trainer,
    module: Module,
    name: str,
    factor: float = 1.0,
    value: int | None = None,
    desc: str | None = None,
    max_val: int = 8192,
) -> tuple[int, bool]:
    size = get_batch_size(module, name)
    length = _dataset_length(trainer, module)
    if length is not None and size >= length:
        rank_zero_info(
            f"The batch size {size} is greater or equal than the length of your dataset: {length}."
        )
        return size, False
    new = value if value is not None else int(size * factor)
    if new > max_val:
        if desc:
            rank_zero_info(f"Batch size {new} exceeds max_val limit {max_val}, capping at {max_val}")
        new = max_val
    if desc:
        rank_zero_info(f"Batch size {size} {desc}, trying batch size {new}")
    set_batch_size(module, name, new)
    return new, new != size


def _trial(trainer: Trainer, module: Module) -> bool:
    """One trial; True when it ran out of memory on any process (all agree on it)."""
    try:
        run_trial(trainer, module, [])
        failed = False
    except RuntimeError as error:
        if not is_oom_error(error):
            raise
        failed = True
        _free_memory()
    return trainer.strategy.reduce_boolean_decision(failed, all=False)


def scale_batch_size(
    trainer: Trainer,
    module: Module,
    mode: str = "power",
    steps_per_trial: int = 3,
    init_val: int = 2,
    max_trials: int = 25,
    batch_arg_name: str = "batch_size",
    margin: float = 0.05,
    max_val: int = 8192,
) -> int | None:
    """Search the largest batch size that fits, inside the running ``fit``; the model and
    Trainer are put back afterwards ([Note: the tuner leaves things as they were] in
    search.py), with the batch size attribute set to the result. None in a ``fast_dev_run``."""
    if trainer.fast_dev_run:
        rank_zero_warn("The batch size finder is skipped in a fast_dev_run.")
        return None
    snapshot = Snapshot(trainer, module)
    bar = trainer.progress_bar_callback
    was_enabled = bar is not None and bar.is_enabled
    if bar is not None:
        bar.disable()
    try:
        trainer.limit_train_batches = 1.0
        trainer.limit_val_batches = steps_per_trial
        size, _ = _adjust(trainer, module, batch_arg_name, value=init_val)
        search = _power if mode == "power" else _binsearch
        size = search(trainer, module, size, batch_arg_name, max_trials, steps_per_trial, margin, max_val)
        _free_memory()
        log.info(f"Finished batch size finder, will continue with full run using batch size {size}")
    finally:
        snapshot.restore(trainer, module)
        rebuild_train_loader(trainer, module)
        # Lightning's finder then makes the rebuilt loader's iterator once (its fit loop's
        # setup_data), drawing a base seed from the global generator: draw it too, so that the
        # run's random numbers go on as Lightning's ([Note: the epoch's draws] in trainer/data.py)
        train_loader = trainer.fit_loop.train_loader
        for prepared in getattr(train_loader, "loaders", [train_loader]):
            if prepared is not None:
                iter(prepared.loader)
        rebuild_val_loaders(trainer, module, snapshot)
        if bar is not None and was_enabled:
            bar.enable()
    return size


def _reset_trial(trainer: Trainer, snapshot_steps: int) -> None:
    progress = trainer.fit_loop.progress
    progress.global_step = progress.epoch = progress.batches_in_epoch = progress.total_batch_idx = 0
    progress.batches_that_stepped = 0
    progress.epoch_start = (0, 0)
    trainer.max_steps = snapshot_steps


def _power(
    trainer: Trainer,
    module: Module,
    size: int,
    name: str,
    max_trials: int,
    steps: int,
    margin: float,
    max_val: int,
) -> int:
    any_success = False
    for i in range(max_trials):
        _reset_trial(trainer, steps)
        if size >= max_val:
            rank_zero_info(f"Reached the maximum batch size limit of {max_val}. Stopping search.")
            break
        if _trial(trainer, module):
            size, _ = _adjust(trainer, module, name, factor=0.5, desc="failed")
            if any_success:
                break
            continue
        if i + 1 >= max_trials:
            break
        size, changed = _adjust(trainer, module, name, factor=2.0, desc="succeeded", max_val=max_val)
        if not changed:
            break
        any_success = True
    return size


def _binsearch(
    trainer: Trainer,
    module: Module,
    size: int,
    name: str,
    max_trials: int,
    steps: int,
    margin: float,
    max_val: int,
) -> int:
    low, high, count = 1, None, 0
    while True:
        _reset_trial(trainer, steps)
        if size >= max_val:
            rank_zero_info(f"Reached the maximum batch size limit of {max_val}. Stopping search.")
            break
        if _trial(trainer, module):
            high = size
            size, _ = _adjust(trainer, module, name, value=(high + low) // 2, desc="failed")
            if high - low <= 1:
                break
            continue
        count += 1
        if count >= max_trials:
            break
        low = size
        if high:
            if high - low <= 1:
                break
            size, changed = _adjust(
                trainer, module, name, value=(high + low) // 2, desc="succeeded", max_val=max_val
            )
        else:
            size, changed = _adjust(trainer, module, name, factor=2.0, desc="succeeded", max_val=max_val)
        if not changed:
            break
    if margin > 0:
        reduced = max(1, int(size * (1 - margin)))
        if reduced != size:
            rank_zero_info(f"Applying margin of {margin:.1%}, reducing batch size from {size} to {reduced}")
            size = reduced
            set_batch_size(module, name, size)
    return size
