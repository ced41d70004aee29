"""``Trainer(on_nonfinite_loss=...)``: what the fit loop does when the training loss is NaN or infinite.

- ``"raise"`` (the default): a process whose loss is non-finite raises
  :class:`~fullshard.errors.NonFiniteLossError` naming the step and its rank, before its optimizer
  step (its weights are still those of the last finite step); the job's other processes are then
  stopped as after any failed process (docs/launching.md).
- ``"skip"``: skip that optimizer step on every rank (the gradients of its accumulation window
  are dropped; ``global_step`` does not count it, unlike a window whose ``training_step`` returned
  None, which steps and counts as in Lightning), and go on;
  but not forever: after ``max_consecutive_nonfinite_skips`` skipped steps in a row (default
  :data:`DEFAULT_MAX_SKIPS`), the next non-finite one raises ``NonFiniteLossError`` saying how many
  were skipped. A model whose every loss is NaN has diverged; skipping its steps only hides that.
- ``None``: no check (the loss goes into the optimizer step whatever it is), but not silently
  either: the first non-finite loss rank 0 sees is reported once, as a warning on rank 0 (a NaN
  on another rank reaches rank 0's weights, and so its loss, through the gradient reduction).

[Note: agreeing on a non-finite loss]
Each rank computes its own loss, and one rank's NaN need not reach the others' (an ``inf`` loss
may even give finite gradients). To raise, a rank needs nobody's agreement: it stops, and the
launcher stops the rest. To skip, every rank must skip the same step, or those that step and
those that do not wait for each other in different collectives: so with ``"skip"`` the ranks
exchange, at each optimizer step, whether a loss of the step's accumulation window was
non-finite, in one ``all_gather`` of three numbers per rank.

The cost: each loss is checked where it is, on a GPU with tensor operations (no synchronisation
while the accumulation window runs), on the CPU by reading the number. At each optimizer step a
GPU's result is read: one device-to-host synchronisation per optimizer step, as
``torch.amp.GradScaler`` makes to decide whether to skip a step. ``"skip"`` with several
processes adds the small all_gather per optimizer step (benchmarks/nonfinite_check.py measures
both). ``on_nonfinite_loss=None`` avoids all of it: the losses are noted the same way, but a
GPU's are read only every ``log_every_n_steps`` optimizer steps (when the step's metrics are
logged and read anyway), and never gathered.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Literal

import torch

from fullshard.errors import MisconfigurationError, NonFiniteLossError

if TYPE_CHECKING:
    from fullshard.trainer.trainer import Trainer

log = logging.getLogger("fullshard")
Mode = Literal["raise", "skip"] | None
MODES = ("raise", "skip", None)
DEFAULT_MAX_SKIPS = 25  # Trainer(max_consecutive_nonfinite_skips=): skipped steps in a row before it raises


def parse(mode: object, max_skips: object = DEFAULT_MAX_SKIPS) -> NonFiniteLoss:
    """The check ``Trainer(on_nonfinite_loss=mode, max_consecutive_nonfinite_skips=max_skips)``
    asks for (None: no check, only a warning)."""
    if mode not in MODES:
        raise MisconfigurationError(
            f"on_nonfinite_loss={mode!r} is invalid: use 'raise' (stop before the optimizer step, the default), "
            "'skip' (skip that optimizer step and go on) or None (no check)."
        )
    if not isinstance(max_skips, int) or isinstance(max_skips, bool) or max_skips < 1:
        raise MisconfigurationError(
            f"max_consecutive_nonfinite_skips={max_skips!r} is invalid: pass a whole number of 1 or more (the "
            f"optimizer steps on_nonfinite_loss='skip' may skip in a row before it raises; default {DEFAULT_MAX_SKIPS})."
        )
    return NonFiniteLoss(mode, max_skips)  # type: ignore[arg-type]


class NonFiniteLoss:
    """The check of one Trainer: :meth:`observe` each loss, :meth:`step_allowed` at each optimizer step."""

    def __init__(self, mode: Mode, max_skips: int = DEFAULT_MAX_SKIPS) -> None:
        self.mode = mode
        self.max_skips = max_skips
        self._skipped_in_a_row = 0  # "skip": optimizer steps skipped since the last one taken
        self._warned = False  # mode None: the one warning was given
        # [non-finite?, the loss, its batch] of the window so far: a tensor on the loss's device
        # (no synchronisation), or on the CPU, where reading a number costs nothing, a tuple
        self._window: torch.Tensor | tuple[float, float, float] | None = None

    def reset(self) -> None:
        """Forget the window in progress (a new epoch starts a new one)."""
        self._window = None

    def observe(self, loss: torch.Tensor, batch_idx: int) -> None:
        """Note the loss of the micro-batch ``batch_idx``."""
        window = self._window
        if isinstance(window, tuple) and window[0]:
            return  # the first non-finite loss of the window is the one reported
        loss = loss.detach()
        if loss.device.type != "cpu":
            self._observe_on_device(loss, batch_idx)
            return
        value = float(loss if loss.numel() == 1 else loss.float().sum())
        if not math.isfinite(value):
            self._window = (1.0, value, float(batch_idx))
        elif window is None:
            self._window = (0.0, 0.0, 0.0)

    def _observe_on_device(self, loss: torch.Tensor, batch_idx: int) -> None:
        """:meth:`observe` without reading the loss: tensor operations on its device."""
        window = self._window
        total = loss.float().sum()
        bad = ~torch.isfinite(total)
        zero = torch.zeros_like(total)
        entry = torch.stack([bad.float(), torch.where(bad, total, zero), zero + batch_idx])
        self._window = (
            entry if not isinstance(window, torch.Tensor) else torch.where(window[0] > 0, window, entry)
        )

    def step_allowed(self, trainer: Trainer) -> bool:
        """Whether the optimizer step of the window observed may be taken. With ``"skip"`` the
        same answer on every rank (a collective, see [Note: agreeing on a non-finite loss]).

        Raises:
            NonFiniteLossError: with ``"raise"``, when this rank's loss was non-finite.
        """
        if self.mode is None:
            self._warn_unchecked(trainer)
            return True
        window, self._window = self._window, None
        if window is None:  # every training_step of the window returned None: neither a skip nor a reset
            return True
        strategy = trainer.strategy
        if self.mode == "raise" or strategy.world_size == 1:
            mine = list(window) if isinstance(window, tuple) else window.tolist()
            reports = {strategy.global_rank: mine}
        else:
            local = (
                window
                if isinstance(window, torch.Tensor)
                else torch.tensor(window, device=strategy.root_device)
            )
            reports = dict(enumerate(strategy.all_gather(local).tolist()))
        bad = [(rank, value, int(batch)) for rank, (flag, value, batch) in reports.items() if flag]
        if not bad:
            self._skipped_in_a_row = 0
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
        if self._skipped_in_a_row >= self.max_skips:  # the same count on every rank: they agreed on each skip
            raise NonFiniteLossError(
                f"The training loss was {values} {where}, after {self._skipped_in_a_row} optimizer steps in a row "
                f"were skipped for a non-finite loss: Trainer(on_nonfinite_loss='skip') skips at most "
                f"max_consecutive_nonfinite_skips={self.max_skips} in a row, so the run stops (the weights are those "
                "of the last step taken). The model has likely diverged: lower the learning rate, or find the "
                "cause of the non-finite loss (Trainer(detect_anomaly=True) names the operation); pass a larger "
                "max_consecutive_nonfinite_skips only if such runs of bad batches are expected."
            )
        self._skipped_in_a_row += 1
        for optimizer in trainer.optimizers:
            optimizer.zero_grad(set_to_none=True)
        if trainer.is_global_zero:
            log.warning(
                "The training loss was %s %s: the optimizer step was skipped (Trainer(on_nonfinite_loss='skip')).",
                values,
                where,
            )
        return False

    def _warn_unchecked(self, trainer: Trainer) -> None:
        """``on_nonfinite_loss=None``: warn once, on rank 0, of the first non-finite loss it sees;
        a GPU's window is kept (and grows) until a logging step reads it."""
        window = self._window
        if self._warned or window is None or not trainer.is_global_zero:
            self._window = None
            return
        if isinstance(window, torch.Tensor):
            if (trainer.global_step + 1) % trainer.log_every_n_steps:
                return  # not read yet: the next losses are noted into the same window
            window = tuple(window.tolist())
        self._window = None
        flag, value, batch = window
        if flag:
            self._warned = True
            log.warning(
                "The training loss was %s at epoch %d, batch %d, and Trainer(on_nonfinite_loss=None) does not "
                "check it: the optimizer steps on, and the weights are likely NaN from now on (checkpoints of "
                "them are refused). Pass on_nonfinite_loss='raise' (the default) to stop there, or 'skip' to "
                "skip such steps. This is said once.",
                value,
                trainer.current_epoch,
                int(batch),
            )
