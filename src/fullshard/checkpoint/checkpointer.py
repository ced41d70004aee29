"""One owner for the checkpoints of one host: :class:`Checkpointer`.

It writes and reads a host's (a strategy's) model and optimizer states through
:mod:`fullshard.checkpoint.engine`, and owns everything a save written in the background leaves
behind it (:class:`~fullshard.checkpoint.async_save.BackgroundSaves`: the process group, the
pinned buffers, the saves still running; and the one being written, :attr:`Checkpointer.pending`),
so every save and load waits for that one first, whichever way it was started.

The Trainer's is owned by its :class:`~fullshard.checkpoint.manager.CheckpointManager` and
connected to the strategy, so that Lightning's ``strategy.save_checkpoint`` goes through it too;
a strategy with no Trainer makes its own. It knows the host only as a
:class:`~fullshard.checkpoint.host.CheckpointHost`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fullshard.checkpoint.async_save import BackgroundSaves, PendingSave, finish
from fullshard.errors import CheckpointError
from fullshard.launch import stuck_ranks

if TYPE_CHECKING:
    from torch.optim import Optimizer

    from fullshard.checkpoint.host import CheckpointHost

# the engine is imported where used: it imports torch's distributed checkpointing, which a run
# that never saves does not pay for at start-up (benchmarks/overhead.py)

TENSOR_ENTRIES = ("state_dict", "optimizer_states")  # what the host provides, in its format


class Checkpointer:
    """Saves (:meth:`write`) and loads (:meth:`read`) ``host``'s states, and owns the save being
    written in the background (:attr:`pending`, :meth:`wait`, :meth:`wait_for_copy`,
    :meth:`after_commit`, :meth:`step_boundary`, :meth:`finish_after_failure`). Every method but
    :meth:`wait_for_copy`, :meth:`after_commit` and :meth:`step_boundary` is collective.

    ``timeout``: of the process group background saves communicate on (the strategy's).
    """

    def __init__(self, host: CheckpointHost, *, timeout: timedelta | None = None) -> None:
        self._host = host
        self.background = BackgroundSaves(timeout)
        self._pending: PendingSave | None = None

    # ------------------------------------------------------------------------------ saving
    def states(self, optimizers: Sequence[Optimizer], *, full: bool, to_save: bool = True) -> dict[str, Any]:
        """The model's and ``optimizers``' states as the host provides them (whole tensors with
        ``full``; ``to_save``, a sharded model's on CUDA on rank 0 only: [Note: full saves gathered
        off the GPU]), read after the previous background save has copied them: a checkpoint's
        ``"state_dict"`` and ``"optimizer_states"``."""
        self.wait()
        with stuck_ranks.paused():  # gathering a full state is checkpoint I/O, not a stuck rank
            model_state, optimizer_states = self._host.get_state(optimizers, full=full, to_save=to_save)
        return {"state_dict": model_state, "optimizer_states": optimizer_states}

    def write(
        self,
        checkpoint: dict[str, Any],
        path: str | Path,
        optimizers: Sequence[Optimizer],
        *,
        sharded: bool,
        background: bool = False,
    ) -> None:
        """Write a checkpoint dict as it is, one file or (``sharded``) a directory of shards, in
        the ``background`` (sharded only: see [Note: asynchronous commit] in async_save.py);
        where it has no model and optimizer states, the current ones of the model and
        ``optimizers`` are added."""
        from fullshard.checkpoint import engine

        if any(key not in checkpoint for key in TENSOR_ENTRIES):
            checkpoint = {**checkpoint, **self.states(optimizers, full=not sharded)}
        self.wait()  # one save at a time (and one staged copy of the state)
        saves = self.background if background else None
        with stuck_ranks.paused():  # checkpoint I/O is never timed as a stuck rank
            self._pending = engine.save(
                self._host, checkpoint, path, optimizers, sharded=sharded, background=saves
            )

    # ------------------------------------------------------------------ the background save
    @property
    def pending(self) -> PendingSave | None:
        """The checkpoint being written in the background, if any: its ``path``, ``step``,
        ``staged_bytes`` and ``copy_wait_s`` (how long optimizer steps waited for its copy so far)."""
        return self._pending

    def wait(self) -> None:
        """Wait until the checkpoint being written in the background, if any, is committed.

        Raises:
            CheckpointError: on every rank, when that save failed and no optimizer step reported
                it yet. The checkpoint previously at its path is intact.
        """
        pending, self._pending = self._pending, None
        if pending is not None:
            with stuck_ranks.paused():
                finish(pending)

    def wait_for_copy(self) -> None:
        """Return once the checkpoint being written in the background, if any, has copied this
        process's parameters and optimizer state; from then on they may be changed in place. No
        communication."""
        if self._pending is not None:
            self._pending.wait_for_copy()

    def after_commit(self, action: Callable[[], None]) -> bool:
        """Run ``action`` on this rank once the checkpoint being written in the background is
        committed, and return True; return False (and do nothing) when none is being written.
        ``action`` is dropped when that save fails. The answer is the same on every rank."""
        if self._pending is None:
            return False
        self._pending.after_commit(action)
        return True

    def step_boundary(self, global_step: int) -> None:
        """Called after each optimizer step: raises the background save's failure at the step
        every rank agrees on ([Note: failures surface at the same step on every rank] in
        async_save.py). An attribute read when no save is pending."""
        if self._pending is not None:
            self._pending.step_boundary(global_step)

    def finish_after_failure(self, exception: BaseException) -> None:
        """When a run fails, let the checkpoint being written in the background commit: it is
        complete, and the last state before the failure. Its own failure, if any, is reported
        beside the run's exception, which goes on."""
        try:
            self.wait()
        except CheckpointError as err:
            warnings.warn(f"{err} (The run itself failed with {type(exception).__name__}.)", stacklevel=4)

    # ----------------------------------------------------------------------------- loading
    def read(
        self,
        path: str | Path,
        optimizers: Sequence[Optimizer] = (),
        *,
        weights_only: bool = False,
        check: Callable[[dict[str, Any]], None] | None = None,
        verify: bool = True,
        trust: bool = False,
        strict: bool = True,
        before_optimizers: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Load a checkpoint's model (and unless ``weights_only``, optimizer) states into place and
        return the rest of it, after the background save, if any, is committed (the checkpoint
        may be that one). The checks and ``before_optimizers`` are
        :func:`fullshard.checkpoint.engine.load`'s."""
        from fullshard.checkpoint import engine

        self.wait()
        with stuck_ranks.paused():
            return engine.load(
                self._host,
                path,
                optimizers,
                weights_only=weights_only,
                check=check,
                verify=verify,
                trust=trust,
                strict=strict,
                before_optimizers=before_optimizers,
            )
