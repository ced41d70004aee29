"""``Trainer(on_nonfinite_loss=...)``: what the fit loop does when the training loss is NaN or infinite.

- ``"raise"`` (the default): a process whose loss is non-finite raises
  :class:`~fullshard.errors.NonFiniteLossError` naming the epoch, the batch, the optimizer step and
  its rank; on the CPU before that optimizer step (its weights are still those of the last finite
  step), on a GPU at the latest before the next one (see [Note: reading the loss without waiting]);
  the job's other processes are then stopped as after any failed process (docs/launching.md).
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

[Note: reading the loss without waiting]
Each loss stays where it is, on its device: nothing reads the losses of a window while it runs. A
read of a GPU tensor makes the CPU wait for the device (a synchronisation): the CPU stops
queueing work until the backward pass is done, and the GPU then idles while the CPU queues the
optimizer step. So ``"raise"`` never reads the device's tensors: at each optimizer step it queues
a copy of the window's losses to pinned host memory (``non_blocking``) with a CUDA event after it, and
reads the copies whose events have completed (``Event.query``, which does not wait). A copy not
done yet is read at the next optimizer step, waiting for it then if it is still not done; that
wait is on a copy queued a whole step earlier, which a GPU has normally finished. So on a GPU
"raise" stops at the latest before the optimizer step after the non-finite one: that one
optimizer step may have been taken, and the weights may hold its update (NaN, usually); a
checkpoint of non-finite weights is refused (fullshard.checkpoint.guards), so none is written
from them. The last windows of an epoch are read before the epoch-end hooks (where checkpoints
are saved), waiting: one synchronisation per epoch. On the CPU every copy is done at once, so
the check raises before the optimizer step, as it reads the copy of the same step.

``"skip"`` must decide before the step: it reads its result at each optimizer step, one
synchronisation per optimizer step on a GPU (as ``torch.amp.GradScaler`` makes to skip a step),
and with several processes adds the small all_gather (benchmarks/nonfinite_check.py measures
both). ``on_nonfinite_loss=None`` reads a GPU's window only every ``log_every_n_steps``
optimizer steps (when the step's metrics are logged and read anyway), and never gathers it.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
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


@dataclass
class HostCopy:
    """A window copied to host memory (:func:`copy_to_host`): ``host`` holds it once ``ready()``
    says so; ``wait()`` blocks until then."""

    host: torch.Tensor
    ready: Callable[[], bool] = lambda: True
    wait: Callable[[], None] = lambda: None


def copy_to_host(window: torch.Tensor) -> HostCopy:
    """Queue a copy of ``window`` to host memory without waiting for it: on CUDA into pinned
    memory, with an event after it; on the CPU a copy, done at once; on other devices a copy that
    waits ([Note: reading the loss without waiting])."""
    cuda = window.device.type == "cuda"
    host = torch.empty(window.shape, dtype=window.dtype, pin_memory=cuda)
    host.copy_(window, non_blocking=cuda or window.device.type == "cpu")
    if not cuda:
        return HostCopy(host)
    event = torch.cuda.Event()
    event.record()
    return HostCopy(host, event.query, event.synchronize)


@dataclass
class _Read:
    """A window's copy on its way to the host, and where the window was."""

    copy: HostCopy
    batches: list[int]  # the batch of each loss copied
    epoch: int
    step: int  # the optimizer step the window's gradients went into


class NonFiniteLoss:
    """The check of one Trainer: :meth:`observe` each loss, :meth:`step_allowed` at each optimizer
    step, :meth:`settle` before the epoch-end hooks.

    ``copy``: how a window reaches the host (:func:`copy_to_host`; a test passes a stand-in to
    play a GPU's copy that is not done yet)."""

    def __init__(
        self,
        mode: Mode,
        max_skips: int = DEFAULT_MAX_SKIPS,
        copy: Callable[[torch.Tensor], HostCopy] = copy_to_host,
    ) -> None:
        self.mode = mode
        self.max_skips = max_skips
        self._copy = copy
        self._skipped_in_a_row = 0  # "skip": optimizer steps skipped since the last one taken
        self._warned = False  # mode None: the one warning was given
        # the window so far: each loss (a float32 scalar on its device, not read) and its batch
        self._losses: list[torch.Tensor] = []
        self._batches: list[int] = []
        self._reads: deque[_Read] = deque()  # "raise": copies not read yet, oldest first

    def reset(self) -> None:
        """Forget the window in progress (a new epoch starts a new one)."""
        self._losses, self._batches = [], []
        self._reads.clear()

    def observe(self, loss: torch.Tensor, batch_idx: int) -> None:
        """Note the loss of the micro-batch ``batch_idx``, without reading it
        ([Note: reading the loss without waiting])."""
        from torch.distributed.tensor import DTensor

        loss = loss.detach()
        if isinstance(loss, DTensor):  # of tensor-parallel outputs: its whole value, as float(loss) reads it
            loss = loss.full_tensor()
        self._losses.append(loss if loss.ndim == 0 and loss.dtype == torch.float32 else loss.float().sum())
        self._batches.append(batch_idx)

    def _take_window(self) -> tuple[torch.Tensor | None, list[int]]:
        """The window's losses as one tensor on their device (None: no loss), and their batches."""
        losses, batches = self._losses, self._batches
        self._losses, self._batches = [], []
        return (torch.stack(losses) if losses else None), batches

    def step_allowed(self, trainer: Trainer) -> bool:
        """Whether the optimizer step of the window observed may be taken. With ``"skip"`` the
        same answer on every rank (a collective, see [Note: agreeing on a non-finite loss]).

        Raises:
            NonFiniteLossError: with ``"raise"``, when a loss of this rank was non-finite: this
                window's, or on a GPU the previous one's ([Note: reading the loss without waiting]).
        """
        if self.mode is None:
            self._warn_unchecked(trainer)
            return True
        window, batches = self._take_window()
        if self.mode == "raise":
            step = trainer.global_step + 1
            if window is not None:
                self._reads.append(_Read(self._copy(window), batches, trainer.current_epoch, step))
            self._read(trainer, step)
            return True
        if window is None:  # every training_step of the window returned None: neither a skip nor a reset
            return True
        return self._agree_to_skip(trainer, window, batches)

    def settle(self, trainer: Trainer) -> None:
        """Read every window copied so far, waiting for the copies (before the epoch-end hooks,
        where checkpoints are saved); with None, the window kept for the warning.

        Raises:
            NonFiniteLossError: with ``"raise"``, when one of them held a non-finite loss.
        """
        if self.mode is None:
            self._warn_unchecked(trainer, now=True)
        self._read(trainer, None)

    def _read(self, trainer: Trainer, step: int | None) -> None:
        """Read the copies that are done, and those older than ``step`` (None: all) waiting for
        them; raise at the first non-finite window."""
        while self._reads:
            read = self._reads[0]
            if not read.copy.ready():
                if read.step == step:
                    return  # queued at this step: read at the next one
                read.copy.wait()
            self._reads.popleft()
            bad = _first_nonfinite(read.copy.host.tolist(), read.batches)
            if bad is not None:
                self._reads.clear()
                taken = step is None or read.step < step
                self._raise(trainer, bad[0], read, bad[1], taken)

    def _raise(self, trainer: Trainer, value: float, read: _Read, batch: int, taken: bool) -> None:
        rank = trainer.strategy.global_rank
        if taken:
            raise NonFiniteLossError(
                f"The training loss was {value} at epoch {read.epoch}, batch {batch} (optimizer step {read.step}) on "
                f"rank {rank}. Trainer(on_nonfinite_loss='raise') reads the loss on the device without waiting for it, "
                "so it stops at the latest one optimizer step later: that optimizer step was taken, and the weights "
                "may hold its non-finite update (no checkpoint of non-finite weights is written). Find the cause (a "
                "learning rate too high, a log or division of 0 in the loss, NaN in the data; "
                "Trainer(detect_anomaly=True) names the operation), or pass on_nonfinite_loss='skip' to skip such "
                "steps (None: no check)."
            )
        raise NonFiniteLossError(
            f"The training loss was {value} at epoch {read.epoch}, batch {batch} (before optimizer step {read.step}) "
            f"on rank {rank}. Trainer(on_nonfinite_loss='raise') stops before that optimizer step, so the weights are "
            "those of the last finite step. Find the cause (a learning rate too high, a log or division of 0 in the "
            "loss, NaN in the data; Trainer(detect_anomaly=True) names the operation), or pass "
            "on_nonfinite_loss='skip' to skip such steps (None: no check)."
        )

    def _agree_to_skip(self, trainer: Trainer, window: torch.Tensor, batches: list[int]) -> bool:
        """``"skip"``: whether any rank's window was non-finite, agreed on by every rank."""
        strategy = trainer.strategy
        if strategy.world_size == 1:
            mine = _first_nonfinite(window.tolist(), batches)
            reports = {strategy.global_rank: [1.0, *mine] if mine else [0.0, 0.0, 0.0]}
        else:
            summary = _summary(window, batches).to(strategy.root_device)
            reports = dict(enumerate(strategy.all_gather(summary).tolist()))
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

    def _warn_unchecked(self, trainer: Trainer, now: bool = False) -> None:
        """``on_nonfinite_loss=None``: warn once, on rank 0, of the first non-finite loss it sees;
        the window is kept (and grows) until a logging step or the epoch's end (``now``) reads it."""
        if self._warned or not self._losses or not trainer.is_global_zero:
            self._losses, self._batches = [], []
            return
        if not now and (trainer.global_step + 1) % trainer.log_every_n_steps:
            return  # not read yet: the next losses join the same window
        window, batches = self._take_window()
        bad = _first_nonfinite(window.tolist(), batches) if window is not None else None
        if bad is not None:
            value, batch = bad
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


def _first_nonfinite(values: list[float], batches: list[int]) -> tuple[float, int] | None:
    """The first non-finite loss of a window read on the host, and its batch."""
    return next(((v, b) for v, b in zip(values, batches, strict=True) if not math.isfinite(v)), None)


def _summary(window: torch.Tensor, batches: list[int]) -> torch.Tensor:
    """``[non-finite?, the first non-finite loss, its batch]`` of a window, on its device (the
    three numbers each rank gathers with ``"skip"``)."""
    bad = ~torch.isfinite(window)
    first = bad.int().argmax()
    where = torch.tensor(batches, device=window.device, dtype=window.dtype)
    return torch.stack([bad.any().float(), torch.where(bad.any(), window[first], 0.0), where[first]])
