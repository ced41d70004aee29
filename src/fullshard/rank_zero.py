"""Messages that read the same on every rank, printed once per job: by global rank 0.

Every process of a job runs the same code, so a warning about the configuration, the model or
a checkpoint would otherwise appear once per process. Those go through :func:`rank_zero_warn`
(and informational lines through :func:`rank_zero_info`, on the ``fullshard`` logger); a warning
about something one rank alone saw (its own failure, its own data) stays a plain
``warnings.warn``, printed by that rank. (Start-up warnings of launched copies are silenced
separately, see [Note: warnings once] in :mod:`fullshard.launch.launchers`.)

[Note: the rank of rank_zero_only]
The rank is kept where Lightning keeps it: on ``lightning_utilities``' :func:`rank_zero_only`
(``rank_zero_only.rank``, re-exported here), which Lightning, and any library built on
``lightning_utilities`` that uses its decorator, read too. The Trainer records its process's
global rank there with :func:`set_global_rank` as soon as its strategy knows it (in
``Trainer.__init__``, and again when ``fit``/``validate``/... set up the processes).
``lightning_utilities``' decorator raises while ``rank_zero_only.rank`` is unset, so importing
this module sets it to 0 unless something imported earlier (Lightning) set it already. It is
not read from the environment here: the rank variables differ from process to process, and the
import must read the same environment in every process (the tests' fork server preloads it).

Before any Trainer recorded a rank, :func:`global_rank`, and so :func:`rank_zero_warn` and
:func:`rank_zero_info`, follow the process group if one is initialized (a script that loads a
checkpoint under torchrun without a Trainer still warns once); the decorator itself reads
``rank_zero_only.rank`` only, as Lightning's does.
"""

from __future__ import annotations

import logging
import warnings

import torch.distributed as dist
from lightning_utilities.core.rank_zero import rank_zero_only

__all__ = [
    "PossibleUserWarning",
    "global_rank",
    "rank_zero_info",
    "rank_zero_only",
    "rank_zero_warn",
    "rank_zero_warn_once",
    "set_global_rank",
]

log = logging.getLogger("fullshard")
# [Note: the rank of rank_zero_only]; the attribute is set on the function (mypy does not know it)
rank_zero_only.rank = getattr(rank_zero_only, "rank", 0)  # type: ignore[attr-defined]
_recorded = False  # whether set_global_rank gave a rank


class PossibleUserWarning(UserWarning):
    """A warning about a setting that is often a mistake but may well be meant (a short run that
    logs no step metrics): the category Lightning gives such warnings, so that a script's
    ``warnings.filterwarnings("ignore", category=PossibleUserWarning)`` keeps working.
    Importable as ``fullshard.utilities.warnings.PossibleUserWarning``, Lightning's path."""


def set_global_rank(rank: int | None) -> None:
    """Record this process's global rank in ``rank_zero_only.rank`` (None: forget the recorded
    rank; the process group's is used while one is initialized, else 0)."""
    global _recorded
    _recorded = rank is not None
    rank_zero_only.rank = rank if rank is not None else _process_group_rank(0)  # type: ignore[attr-defined]


def global_rank() -> int:
    """This process's rank, as the Trainer recorded it (:func:`set_global_rank`); before any
    Trainer did, the process group's, or ``rank_zero_only.rank`` (0) without one."""
    rank: int = getattr(rank_zero_only, "rank", 0)
    return rank if _recorded else _process_group_rank(rank)


def _process_group_rank(default: int) -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else default


def rank_zero_warn(message: str, category: type[Warning] = UserWarning, stacklevel: int = 2) -> None:
    """``warnings.warn(message, category, stacklevel)`` on global rank 0 only.

    ``stacklevel`` counts from the caller, as for ``warnings.warn``. (``lightning_utilities``'
    ``rank_zero_warn`` takes the category as a keyword only and counts ``stacklevel`` from inside
    its decorator; this one keeps the signature of ``warnings.warn``, which fullshard's callers use.)
    """
    if global_rank() == 0:
        warnings.warn(message, category, stacklevel=stacklevel + 1)


_said_once: set[str] = set()  # the messages rank_zero_warn_once gave in this process


def rank_zero_warn_once(message: str, category: type[Warning] = UserWarning, stacklevel: int = 2) -> None:
    """:func:`rank_zero_warn`, once per process for each message (what Lightning says through its
    module-level ``WarningCache``: a second Trainer of the same process stays silent)."""
    if message not in _said_once:
        _said_once.add(message)
        rank_zero_warn(message, category, stacklevel=stacklevel + 1)


def rank_zero_debug(message: str) -> None:
    """``message`` logged at DEBUG on the ``fullshard`` logger, on global rank 0 only."""
    if global_rank() == 0:
        log.debug(message, stacklevel=2)


def rank_zero_info(message: str) -> None:
    """``message`` logged at INFO on the ``fullshard`` logger, on global rank 0 only.

    (``lightning_utilities``' ``rank_zero_info`` logs on its own logger, which has no handler:
    fullshard's messages go to the ``fullshard`` logger, which prints them.)"""
    if global_rank() == 0:
        log.info(message, stacklevel=2)
