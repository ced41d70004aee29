"""``Fetcher``: the batches of one pass over a loader, drawn in Lightning's order.

[Note: fetching a batch ahead]
Lightning's loops read a loader whose number of batches is unknown (an iterable dataset without
``__len__``, no integer ``limit_*_batches``) one batch ahead: the iterator is made, and its first
batch drawn, before the run's start hooks, and batch ``i + 1`` is drawn before the step of batch
``i`` runs, so that the step knows whether it is the last one (``trainer.is_last_batch``). A
dataset whose iterator reads state the steps change (a replay buffer an agent fills in
``training_step``) sees that interleaving, so fullshard's loops fetch in the same order. A loader
with a known length is read without fetching ahead, as in Lightning: its last batch is known by
count.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


class Fetcher(Iterator[Any]):
    """The batches of ``iterator``; ``ahead``: draw each one a batch before it is returned, and
    tell the last (:attr:`done`) as soon as it is returned (see [Note: fetching a batch ahead])."""

    def __init__(self, iterator: Iterator[Any], *, ahead: bool) -> None:
        self.iterator = iterator
        self.ahead = ahead
        self.done = False
        """Whether the batch returned last is the last one (known only when fetching ahead)."""
        self._pending: list[Any] = []
        if ahead:
            self._fetch()
            self.done = not self._pending

    def _fetch(self) -> None:
        with contextlib.suppress(StopIteration):  # the end: nothing pending
            self._pending.append(next(self.iterator))

    def __next__(self) -> Any:
        if not self.ahead:
            return next(self.iterator)
        if not self._pending:
            raise StopIteration
        batch = self._pending.pop()
        self._fetch()
        self.done = not self._pending
        return batch
