"""Moving a batch to the device, and the batch-transfer hooks a Module or DataModule overrides.

``Strategy.batch_to_device`` runs, as Lightning's does, ``on_before_batch_transfer``,
``transfer_batch_to_device`` and ``on_after_batch_transfer`` of whichever object overrides each
(the DataModule's first, then the Module's; see :func:`resolve_batch_transfer` in
``trainer/hooks.py``). The Trainer makes that choice once per ``fit``/``validate``/``test``/
``predict`` and passes it to each ``batch_to_device`` call (``transfer=``, None when nothing is
overridden: the strategy's fast path); a direct call (``trainer.strategy.batch_to_device(batch)``)
runs the module's own hooks, as Lightning's strategy does.
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Callable
from typing import Any, Literal

import torch

from fullshard.nested import apply_to_collection
from fullshard.rank_zero import rank_zero_warn_once


class _Transferable(ABC):  # noqa: B024  # no abstract methods: a structural check via __subclasshook__
    """Anything with a callable ``to`` (a tensor, or a user's batch class with a ``.to()``)."""

    @classmethod
    def __subclasshook__(cls, subclass: Any) -> Any:
        if cls is _Transferable:
            return bool(callable(getattr(subclass, "to", None)))
        return NotImplemented


def move_data_to_device(batch: Any, device: torch.device | str | int) -> Any:
    """``batch`` with every tensor, and every object that has a ``.to(device)`` method, moved to
    ``device``; lists, tuples, dicts, named tuples and dataclasses are walked into. An object
    whose ``.to`` returns None (moved in place) is kept."""
    device = torch.device(device) if not isinstance(device, torch.device) else device
    non_blocking = device.type != "cpu"

    def move(data: Any) -> Any:
        moved = (
            data.to(device, non_blocking=non_blocking) if isinstance(data, torch.Tensor) else data.to(device)
        )
        return data if moved is None else moved

    return apply_to_collection(batch, dtype=_Transferable, function=move)


class BatchTransfer:
    """The three batch-transfer hooks, each the callable that overrides it (or the default), and
    the warnings about which was chosen (``notes``), given when the first batch moves, where
    Lightning gives them (a run that fails before its first batch says nothing of them)."""

    def __init__(
        self,
        before: Callable[[Any, int], Any],
        transfer: Callable[[Any, torch.device, int], Any],
        after: Callable[[Any, int], Any],
        notes: tuple[str, ...] = (),
    ) -> None:
        self.before = before
        self.transfer = transfer
        self.after = after
        self._notes = list(notes)

    def __call__(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        while self._notes:
            rank_zero_warn_once(self._notes.pop(0), stacklevel=3)
        batch = self.before(batch, dataloader_idx)
        batch = self.transfer(batch, device, dataloader_idx)
        return self.after(batch, dataloader_idx)


BATCH_TRANSFER_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")

# ``Strategy.batch_to_device(transfer=...)``: the batch-transfer hooks to run (the Trainer passes
# the ones it resolved for the call), None when no hook is overridden (the strategy's fast path),
# or ``"module"`` (a direct call, as ``trainer.strategy.batch_to_device(batch)``): the strategy's
# module's own hooks, as Lightning's strategy runs them.
Transfer = BatchTransfer | Literal["module"] | None


def resolve_transfer(transfer: Transfer, module: Any) -> BatchTransfer | None:
    """``transfer``, with ``"module"`` made the batch-transfer hooks of ``module`` itself (a
    fullshard Module; a plain ``nn.Module`` has none: None)."""
    if not isinstance(transfer, str):
        return transfer
    hooks = [getattr(module, name, None) for name in BATCH_TRANSFER_HOOKS]
    if not all(callable(hook) for hook in hooks):
        return None
    before, move, after = hooks
    return BatchTransfer(before, move, after)  # type: ignore[arg-type]
