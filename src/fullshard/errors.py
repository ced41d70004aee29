"""The exception types users catch.

Every error raised for bad user input says what was given, what is accepted and how to fix
it. The classes below subclass the builtin type a caller would expect (``ValueError``,
``RuntimeError``), so ``except ValueError`` keeps working.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class FullshardError(Exception):
    """Base class of every exception fullshard defines."""


class MisconfigurationError(FullshardError, ValueError):
    """A Trainer, Strategy or Module was configured with values that cannot work together."""


class MisconfigurationTypeError(MisconfigurationError, TypeError):
    """An argument of a type it does not take (a string where a bool belongs, one object where a
    list of callbacks does). Both ``except TypeError``, which catches Lightning's error for the
    same inputs, and ``except MisconfigurationError`` catch it."""


class StrategyRegistryError(FullshardError, KeyError):
    """A strategy name is unknown, or registered twice without ``override=True``."""

    def __str__(self) -> str:  # KeyError quotes its message; show it as written.
        return str(self.args[0]) if self.args else ""


class CheckpointError(FullshardError, RuntimeError):
    """A checkpoint could not be written or read."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """The path given as a checkpoint does not exist, or holds no checkpoint."""


class IncompleteCheckpointError(CheckpointError):
    """The checkpoint at a path was never completed (its save was interrupted)."""


class OptimizerGroupsMismatchError(CheckpointError, ValueError):
    """A checkpoint's optimizer state has another number of parameter groups than the optimizer
    it is loaded into (a ValueError, as torch's ``Optimizer.load_state_dict`` raises for it)."""


class CorruptCheckpointError(CheckpointError):
    """The checkpoint at a path is damaged: truncated, a file fails its CRC-32 check, or its
    content fails to decode."""


class UntrustedCheckpointError(CheckpointError):
    """A checkpoint holds objects other than plain data (tensors, numbers, strings, lists,
    dicts, ...): unpickling them could run code the file names, so it was not loaded. Load it
    with ``trust_checkpoint=True`` (``--trust`` on the command line) only if you trust who wrote it.

    :attr:`found` lists what the file names (``"posix.system"``), :attr:`path` the file."""

    def __init__(self, message: str, path: str = "", found: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.path = path
        self.found = tuple(found)

    def __reduce__(self) -> tuple[object, ...]:  # rebuilt on other ranks after a broadcast
        return (type(self), (str(self), self.path, self.found))


class CheckpointSaveError(CheckpointError, OSError):
    """A checkpoint could not be written (disk full, no permission, ...). Nothing was committed:
    the checkpoint previously at the path, if any, is intact, and the partial files are removed.

    An ``OSError`` too, so ``except OSError`` handlers keep working; :attr:`errno` is the
    cause's (``errno.ENOSPC`` for a full disk), None when the cause was no ``OSError``.
    """

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno

    def __reduce__(self) -> tuple[object, ...]:  # rebuilt on other ranks after a broadcast
        return (type(self), (str(self), self.errno))


class NonFiniteLossError(FullshardError, ArithmeticError):
    """The training loss became NaN or infinite (``Trainer(on_nonfinite_loss="raise")``)."""


class ProcessFailedError(FullshardError, RuntimeError):
    """Another process of the job failed; this one was stopped because of it."""


class RankDivergenceError(FullshardError, RuntimeError):
    """The processes of a job took different paths (one skipped a step, or ran out of data,
    while the others went on into a collective)."""


def did_you_mean(given: object, choices: Iterable[str]) -> str:
    """`` Did you mean 'x'?`` naming the choice closest to a mistyped ``given``; empty when none is close."""
    if not isinstance(given, str):
        return ""
    close = difflib.get_close_matches(given.lower(), list(choices), n=1)
    return f" Did you mean {close[0]!r}?" if close else ""
