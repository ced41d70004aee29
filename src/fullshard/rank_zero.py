"""Warnings that read the same on every rank, printed once per job: by global rank 0.

Every process of a job runs the same code, so a warning about the configuration, the model or
a checkpoint would otherwise appear once per process. Those go through :func:`rank_zero_warn`;
a warning about something one rank alone saw (its own failure, its own data) stays a plain
``warnings.warn``, printed by that rank. (Start-up warnings of launched copies are silenced
separately, see [Note: warnings once] in :mod:`fullshard.launch.launchers`.)
"""

from __future__ import annotations

import warnings

import torch.distributed as dist
from lightning_utilities.core.rank_zero import rank_zero_only


def rank_zero_warn(message: str, category: type[Warning] = UserWarning, stacklevel: int = 2) -> None:
    """``warnings.warn(message, category, stacklevel)`` on global rank 0 only.

    ``stacklevel`` counts from the caller, as for ``warnings.warn``.
    """
    if global_rank() == 0:
        warnings.warn(message, category, stacklevel=stacklevel + 1)


def global_rank() -> int:
    """This process's rank, as the Trainer recorded it in ``rank_zero_only.rank`` (shared with
    lightning_utilities' own ``rank_zero_warn``); before any Trainer did, the process group's."""
    rank = getattr(rank_zero_only, "rank", None)
    if rank is None:
        return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    return int(rank)
