"""Decisions every rank of a job shares, taken through a host's collectives.

A decision that depends on one rank's view (does the checkpoint exist, is it complete, does it
fit) is taken on rank 0 and broadcast (:func:`decide`); work every rank does on its own ends with
an exchange of what went wrong (:func:`agreed`). Either way every rank raises the same exception
at the same point, instead of some ranks waiting forever for the others.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from fullshard.errors import CheckpointError

if TYPE_CHECKING:
    from fullshard.checkpoint.host import CheckpointHost

T = TypeVar("T")


def decide(host: CheckpointHost, choose: Callable[[], T]) -> T:
    """Run ``choose`` on rank 0 and give every rank its result, or raise its exception everywhere.

    Any ``Exception`` of rank 0 is raised on every rank (one that does not pickle, as a
    :class:`CheckpointError` with its type and message): the other ranks wait for rank 0's
    answer, and an exception that rank 0 kept to itself would leave them waiting forever.
    """
    outcome: tuple[Any, BaseException | None] = (None, None)
    if host.global_rank == 0:
        try:
            outcome = (choose(), None)
        except Exception as err:
            outcome = (None, err if host.world_size == 1 else portable(err))
    result, error = host.broadcast(outcome)
    if error is not None:
        raise error
    return result  # type: ignore[no-any-return]


def portable(err: Exception) -> Exception:
    """``err`` if it survives pickling (a broadcast), else a CheckpointError that says what it was."""
    try:
        pickle.loads(pickle.dumps(err))
    except Exception:
        return CheckpointError(f"{type(err).__name__}: {err}")
    return err


def agreed(host: CheckpointHost, make: Callable[[], T]) -> T:
    """``make()`` on every rank; if it raises on any rank, that exception on every rank (the
    first rank's), rather than some ranks going on into collectives alone. (Each rank reads the
    file rank 0 checked before; this catches a file that changed since.)"""
    made: Any = None
    problem: Exception | None = None
    try:
        made = make()
    except Exception as err:
        problem = portable(err) if host.world_size > 1 else err
    problems = [p for p in host.all_gather_object(problem) if p is not None]
    if problems:
        raise problems[0]
    return made  # type: ignore[no-any-return]
