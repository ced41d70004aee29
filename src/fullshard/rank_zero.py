"""Messages that read the same on every rank, printed once per job: by global rank 0.

Every process of a job runs the same code, so a warning about the configuration, the model or
a checkpoint would otherwise appear once per process. Those go through :func:`rank_zero_warn`
(and informational lines through :func:`rank_zero_info`, on the ``fullshard`` logger); a warning
about something one rank alone saw (its own failure, its own data) stays a plain
``warnings.warn``, printed by that rank. (Start-up warnings of launched copies are silenced
separately, see [Note: warnings once] in :mod:`fullshard.launch.launchers`.)

The Trainer records its process's rank with :func:`set_global_rank`. Libraries built on
``lightning_utilities`` (torchmetrics) keep their own record of it, which is set too when they
are loaded, so their warnings also print once.
"""

from __future__ import annotations

import functools
import logging
import sys
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import torch.distributed as dist

T = TypeVar("T")
log = logging.getLogger("fullshard")
_rank: int | None = None


def set_global_rank(rank: int | None) -> None:
    """Record this process's global rank (None: read it from the process group, else 0)."""
    global _rank
    _rank = rank
    shared = sys.modules.get("lightning_utilities.core.rank_zero")  # loaded by torchmetrics, if at all
    if shared is not None:
        if rank is None:
            vars(shared.rank_zero_only).pop("rank", None)
        else:
            shared.rank_zero_only.rank = rank


def global_rank() -> int:
    """This process's rank, as the Trainer recorded it (:func:`set_global_rank`); before any
    Trainer did, the process group's, or 0 without one."""
    if _rank is None:
        return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    return _rank


def rank_zero_only(fn: Callable[..., T]) -> Callable[..., T | None]:
    """``fn`` run on global rank 0 only; elsewhere the call does nothing and returns None."""

    @functools.wraps(fn)
    def on_rank_zero(*args: Any, **kwargs: Any) -> T | None:
        return fn(*args, **kwargs) if global_rank() == 0 else None

    return on_rank_zero


def rank_zero_warn(message: str, category: type[Warning] = UserWarning, stacklevel: int = 2) -> None:
    """``warnings.warn(message, category, stacklevel)`` on global rank 0 only.

    ``stacklevel`` counts from the caller, as for ``warnings.warn``.
    """
    if global_rank() == 0:
        warnings.warn(message, category, stacklevel=stacklevel + 1)


def rank_zero_info(message: str) -> None:
    """``message`` logged at INFO on the ``fullshard`` logger, on global rank 0 only."""
    if global_rank() == 0:
        log.info(message, stacklevel=2)
