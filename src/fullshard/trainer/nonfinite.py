"""``Trainer(on_nonfinite_loss=...)``: what the fit loop does when the training loss is NaN or infinite.

- ``"raise"`` (the default): stop before the optimizer step, on every rank, with
  :class:`~fullshard.errors.NonFiniteLossError` naming the step and the ranks; the weights are
  still those of the last finite step.
- ``"skip"``: skip that optimizer step on every rank (the gradients of its accumulation window
  are dropped; ``global_step`` does not count it, as when ``training_step`` returns None), and go on.
- ``None``: no check (the loss goes into the optimizer step whatever it is).

[Note: agreeing on a non-finite loss]
Each rank computes its own loss, and one rank's NaN need not reach the others' (a loss that is
``inf`` may even give finite gradients), yet every rank must take the same decision: a rank that
skips the optimizer step or raises while the others step leaves them waiting in different
collectives. So at each optimizer step the ranks exchange, in one ``all_gather`` of two numbers
per rank, whether a loss of the step's accumulation window was non-finite, and its value.

The cost: while the window runs, each loss is checked on its own device (``torch.isfinite``, no
synchronisation); at the optimizer step, with several processes, the one small all_gather
(gloo on CPU: about 0.1 ms; NCCL: a few microseconds); and reading the result, which on a GPU
waits for the backward pass to finish: one device-to-host synchronisation per optimizer step, as
``torch.amp.GradScaler`` makes to decide whether to skip a step. ``on_nonfinite_loss=None``
avoids all of it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Literal

import torch

from fullshard.errors import MisconfigurationError, NonFiniteLossError

if TYPE_CHECKING:
    from fullshard.trainer.trainer import Trainer

log = logging.getLogger("fullshard")
Mode = Literal["raise", "skip"]
MODES = ("raise", "skip", None)


def parse(mode: object) -> NonFiniteLoss | None:
    """The check ``Trainer(on_nonfinite_loss=mode)`` asks for (None: no check)."""
    if mode is None:
        return None
    if mode not in ("raise", "skip"):
        raise MisconfigurationError(
            f"on_nonfinite_loss={mode!r} is invalid: use 'raise' (stop before the optimizer step, the default), "
            "'skip' (skip that optimizer step and go on) or None (no check)."
        )
    return NonFiniteLoss(mode)  # type: ignore[arg-type]


class NonFiniteLoss:
    """The check of one Trainer: :meth:`observe` each loss, :meth:`step_allowed` at each optimizer step."""

    def __init__(self, mode: Mode) -> None:
        self.mode = mode
        self._window: torch.Tensor | None = None  # [non-finite?, the loss, its batch], of the window so far

    def reset(self) -> None:
        """Forget the window in progress (a new epoch starts a new one)."""
        self._window = None

    def observe(self, loss: torch.Tensor, batch_idx: int) -> None:
        """Note the loss of the micro-batch ``batch_idx`` (on its device: no synchronisation)."""
        value = loss.detach().float().sum()
        bad = ~torch.isfinite(value)
        zero = torch.zeros_like(value)
        entry = torch.stack([bad.float(), torch.where(bad, value, zero), zero + batch_idx])
        window = self._window
        # the first non-finite loss of the window is the one reported
        self._window = entry if window is None else torch.where(window[0] > 0, window, entry)

    def step_allowed(self, trainer: Trainer) -> bool:
        """Whether the optimizer step of the window observed may be taken, the same answer on
        every rank (collective, see [Note: agreeing on a non-finite loss]).

        Raises:
            NonFiniteLossError: with ``"raise"``, when a rank's loss was non-finite.
        """
        window, self._window = self._window, None
        if window is None:
            return True
        reports = trainer.strategy.all_gather(window).tolist()
        bad = [(rank, value, int(batch)) for rank, (flag, value, batch) in enumerate(reports) if flag]
        if not bad:
            return True
        batches = sorted({batch for _, _, batch in bad})
        where = (
            f"at epoch {trainer.current_epoch}, batch{'es' if len(batches) > 1 else ''} "
            f"{', '.join(map(str, batches))} (before optimizer step {trainer.global_step + 1}) on rank"
            f"{'s' if len(bad) > 1 else ''} {', '.join(str(rank) for rank, _, _ in bad)}"
        )
        values = " and ".join(sorted({str(value) for _, value, _ in bad}))
        if self.mode == "raise":
            raise NonFiniteLossError(
                f"The training loss was {values} {where}. Trainer(on_nonfinite_loss='raise') stops before that "
                "optimizer step, so the weights are those of the last finite step. Find the cause (a learning rate "
                "too high, a log or division of 0 in the loss, NaN in the data; Trainer(detect_anomaly=True) names "
                "the operation), or pass on_nonfinite_loss='skip' to skip such steps (None: no check)."
            )
        for optimizer in trainer.optimizers:
            optimizer.zero_grad(set_to_none=True)
        if trainer.is_global_zero:
            log.warning(
                "The training loss was %s %s: the optimizer step was skipped (Trainer(on_nonfinite_loss='skip')).",
                values,
                where,
            )
        return False
