"""Preparing a stage's loader and counting its batches; when validation runs during training.

Free functions over the Trainer's public settings; the loops own what they return.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from fullshard.errors import MisconfigurationError, RankDivergenceError
from fullshard.seed import current_seed
from fullshard.trainer.data import PreparedLoader, limit_batches, prepare_dataloader

if TYPE_CHECKING:
    from fullshard.strategies import Strategy
    from fullshard.trainer.trainer import Trainer

_LIMIT = {"train": "limit_train_batches", "val": "limit_val_batches", "test": "limit_test_batches",
          "predict": "limit_predict_batches"}  # fmt: skip


def prepare(trainer: Trainer, loader: Any, kind: str) -> tuple[PreparedLoader, int | float]:
    """``loader`` as the loops use it (``kind``: train, val, test or predict), and its batches per
    run after the Trainer's ``limit_<kind>_batches``."""
    prepared = prepare_dataloader(
        loader,
        shuffle_default=kind == "train",
        seed=current_seed(),
        name=f"The {kind} dataloader",
        distributed=trainer.use_distributed_sampler,
        **trainer.strategy.distributed_sampler_kwargs,
    )
    available = len(prepared) if prepared.has_len() else math.inf
    return prepared, limit_batches(getattr(trainer, _LIMIT[kind]), available, _LIMIT[kind])


def check_same_batch_count(strategy: Strategy, count: int | float, what: str) -> None:
    """Every rank must run as many batches, or the ones that finish first leave the others
    waiting in a collective; a map-style loader's count is known now, so compare it once."""
    if strategy.world_size == 1:
        return
    counts = strategy.all_gather_object(count)
    if len(set(counts)) > 1:
        listed = ", ".join(f"rank {r}: {c}" for r, c in enumerate(counts))
        raise RankDivergenceError(
            f"The processes have different numbers of {what} batches per epoch ({listed}), so the ones "
            "that finish first would wait for the others forever. Give every process the same number "
            "of batches: use the Trainer's distributed sampler (use_distributed_sampler=True, the "
            "default) or make your own sampler split the data evenly."
        )


def val_check_batch(trainer: Trainer, val_batches: int | float, train_batches: int | float) -> int | float:
    """Validate after every this many training batches (inf: at the end of each epoch; 0: never)."""
    if val_batches == 0:
        return 0
    interval = trainer.val_check_interval
    if isinstance(interval, int):
        if trainer.check_val_every_n_epoch is not None and not math.isinf(train_batches) and interval > train_batches:
            raise MisconfigurationError(
                f"val_check_interval={interval} is more than the {train_batches} training batches "
                "of an epoch. Pass a smaller number, or check_val_every_n_epoch=None to count batches "
                "across epochs."
            )
        return interval
    if math.isinf(train_batches):
        if interval == 1.0:
            return math.inf  # validated at the end of each epoch
        raise MisconfigurationError(
            "val_check_interval is a fraction, but the training dataloader has no length. Pass a number "
            "of batches instead, e.g. val_check_interval=1000."
        )
    return max(1, int(train_batches * interval))
