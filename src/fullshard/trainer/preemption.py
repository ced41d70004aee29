"""Preemption: a cluster's stop signal becomes a committed checkpoint and a documented exit.

[Note: preemption, agreed without a per-step collective]
SLURM and Kubernetes stop a job with SIGTERM (SLURM can send SIGUSR1 ahead of the time limit),
often to one process only (a container's first process). The signal handler only notes the
signal: saving there would run collectives and file I/O at an arbitrary point of the program
(Lightning's issue #21406). The save happens at a *boundary*: the end of an accumulation window,
whether its optimizer step ran or was skipped (``on_nonfinite_loss="skip"``), so a run that
skips every step still stops. Every rank must pick
the *same* boundary, or some would start the checkpoint's collectives while others start the
next window's. Boundaries are named by their *position*, the number of batches the fit has run
(the same on every rank, which all run the same batches), not by the optimizer step, which a
skipped window does not move.

The ranks agree through the process group's key-value store, not a collective, so a boundary
with no signal in sight costs one attribute read:

1. The signalled rank, at its next boundary, sets the key ``request``.
2. A daemon thread in every rank polls the store for ``request`` every :data:`POLL_S` seconds.
   Once a rank knows of the request (its own signal or the thread), it publishes its position
   at its next boundary (``position/<rank>``), and goes on training.
3. When every rank has published, each stops at the first boundary past ``latest =
   max(published)``. Every window ends with something all ranks take part in (the gradient
   reduction, the agreement on a skipped step, the non-finite check's gather), so no rank can
   finish a window another has not started. Let ``L`` be the rank that publishes last, at its
   boundary ``p_L <= latest``: until then ``L`` has not started the next window, so no rank gets
   past the boundary after ``p_L``, and each looks at the keys again at each boundary, so every
   rank finds ``latest`` at a boundary no later than the first one past ``latest``, and stops
   there.

Then every rank saves one checkpoint (crash-safe commit, synchronous or a background save that
is waited for), rank 0 asks SLURM to requeue the job when it runs under SLURM with requeue on,
and :class:`TrainingPreempted` (a ``SystemExit``) leaves ``fit`` with exit code ``128 +
signal``, what a shell reports for a process the signal ended. A second signal while the save
runs is ignored; a second signal before the save started (a rank stuck away from any step
boundary) ends the process as the signal would have, which the crash-safe commit makes safe.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

from fullshard.errors import MisconfigurationError
from fullshard.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from fullshard.trainer.trainer import Trainer

DEFAULT_SIGNALS = ("SIGTERM", "SIGUSR1")
POLL_S = 0.2  # how often a rank's thread looks for another rank's request in the store
PREEMPTED_CHECKPOINT = "last.ckpt"  # in the ModelCheckpoint's directory, else in default_root_dir


class TrainingPreempted(SystemExit):
    """Raised out of ``fit`` on every rank once the preemption checkpoint is committed; its
    ``code`` (the process's exit status when uncaught) is ``128 + signal number``."""

    def __init__(self, signum: int, path: str, step: int) -> None:
        super().__init__(128 + signum)
        self.signum, self.path, self.step = signum, path, step

    def __str__(self) -> str:
        return (
            f"training stopped by {signal.Signals(self.signum).name} at step {self.step}; checkpoint saved to "
            f"{self.path}. Resume with fit(ckpt_path='last') (exit code {self.code})."
        )


def parse_signals(value: Any) -> tuple[signal.Signals, ...]:
    """``preemption_signals=``: names (``"SIGTERM"``), numbers or ``signal.Signals``; None or
    an empty sequence turns preemption handling off."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str | int | signal.Signals) else value
    if not isinstance(items, Sequence | set | frozenset):
        raise MisconfigurationError(
            f"preemption_signals={value!r} is not a signal or a list of signals. Pass names such as "
            f"{list(DEFAULT_SIGNALS)!r}, signal numbers, or None to turn preemption handling off."
        )
    found = []
    for item in items:
        try:
            sig = signal.Signals[item.upper()] if isinstance(item, str) else signal.Signals(item)
        except (KeyError, ValueError):
            sig = None
        if sig is None or sig in (signal.SIGKILL, signal.SIGSTOP):
            raise MisconfigurationError(
                f"preemption_signals got {item!r}, which is not a signal that can be handled. Use names such "
                f"as 'SIGTERM' or 'SIGUSR1' (SIGKILL and SIGSTOP cannot be caught), or numbers."
            )
        found.append(sig)
    return tuple(dict.fromkeys(found))


def requeue_job(job_id: str) -> None:
    """Ask SLURM to put job ``job_id`` back in the queue. The seam tests replace."""
    subprocess.run(["scontrol", "requeue", job_id], check=True, timeout=60)


class Preemption:
    """One ``fit`` call's preemption handling (see [Note: preemption, agreed without a per-step
    collective]). ``requested`` is what the loop reads at each boundary."""

    _sessions = 0  # per process: every rank runs the same fits, so the same count names a session

    def __init__(self, signals: tuple[signal.Signals, ...], requeue: bool) -> None:
        self.signals = signals
        self.requeue = requeue
        self.requested = False  # this rank knows of a request (own signal or another rank's)
        self.signum = 0
        self.saving = False
        self._own = False  # this rank received a signal
        self._announced = False
        self._published = False
        self._latest: int | None = None  # the largest position published, once every rank has
        self._checked = -1  # the position of this rank's last boundary since it published
        self._previous: dict[signal.Signals, Any] = {}
        self._store: Any = None  # only while fit runs (set by start, dropped by stop)
        self._prefix = ""
        self._world_size = 1
        self._rank = 0
        # made by start(): an idle Preemption holds no thread objects (a Trainer is pickled for spawn)
        self._stop: threading.Event | None = None

    # -------------------------------------------------------------------------- life cycle
    def start(self, trainer: Trainer) -> None:
        """Install the handlers (main thread only) and, with several processes, the poller."""
        if threading.current_thread() is not threading.main_thread():
            rank_zero_warn(
                "fit() runs outside the main thread, where signal handlers cannot be installed: preemption "
                "signals are not handled. Call fit() from the main thread, or pass preemption_signals=None.",
                stacklevel=3,
            )
            return
        Preemption._sessions += 1
        strategy = trainer.strategy
        self._world_size, self._rank = strategy.world_size, strategy.global_rank
        self._store = strategy.key_value_store()
        self._prefix = f"fullshard/preemption/{Preemption._sessions}"
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        if self._store is not None and self._world_size > 1:
            self._stop = threading.Event()
            threading.Thread(
                target=self._poll, args=(self._stop,), name="fullshard-preemption", daemon=True
            ).start()

    def stop(self) -> None:
        """Put the previous handlers back and end the poller."""
        if self._stop is not None:
            self._stop.set()
            self._stop = None
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        self._store = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if not self.requested or not self._own:
            self.requested, self._own, self.signum = True, True, signum
            return
        if self.saving:
            return  # the checkpoint is being written: let it finish
        # a second signal before any step boundary came: end as the signal would have
        previous = self._previous.get(signal.Signals(signum), signal.SIG_DFL)
        signal.signal(signum, previous if callable(previous) else signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def _poll(self, stop: threading.Event) -> None:
        key = f"{self._prefix}/request"
        while not stop.wait(POLL_S):
            try:
                if self._store.check([key]):
                    if not self.requested:
                        self.signum = int(self._store.get(key))
                        self.requested = True
                    return
            except Exception:  # the store went away (the job is ending): nothing to agree on
                return

    # ------------------------------------------------------------------- at a step boundary
    def should_stop(self, position: int) -> bool:
        """Called by the loop at each boundary once ``requested``, with the number of batches
        the fit has run: True at the boundary every rank stops at."""
        if self._store is None or self._world_size == 1:
            return True
        store = self._store
        if self._own and not self._announced:
            store.set(f"{self._prefix}/request", str(self.signum))
            self._announced = True
        if not self._published:
            store.set(f"{self._prefix}/position/{self._rank}", str(position))
            self._published = True
        if self._latest is None:
            keys = [f"{self._prefix}/position/{rank}" for rank in range(self._world_size)]
            if not store.check(keys):
                self._checked = position
                return False
            self._latest = max(int(store.get(k)) for k in keys)
            if self._checked > self._latest:  # cannot happen, see the note; never save out of step
                raise RuntimeError(
                    f"rank {self._rank} passed the agreed preemption position {self._latest} (at {self._checked}); "
                    "please report this as a fullshard bug."
                )
        self._checked = position
        return position > self._latest

    def save_and_exit(self, trainer: Trainer) -> None:
        """Save the preemption checkpoint on every rank, requeue under SLURM, and raise
        :class:`TrainingPreempted`."""
        self.saving = True
        path = preemption_checkpoint_path(trainer)
        started = time.monotonic()
        trainer.save_checkpoint(path)
        trainer.checkpoint_manager.wait()  # committed before anyone leaves
        seconds = time.monotonic() - started
        job_id = os.environ.get("SLURM_JOB_ID")
        if trainer.is_global_zero:
            trainer.print(
                f"fullshard: {signal.Signals(self.signum).name} received; saved {path} at step "
                f"{trainer.global_step} in {seconds:.1f} s"
            )
            if self.requeue and job_id:
                requeue_job(job_id)
                trainer.print(f"fullshard: requeued SLURM job {job_id}")
        from fullshard.launch.launchers import expect_exit_code

        expect_exit_code(128 + self.signum)
        raise TrainingPreempted(self.signum, path, trainer.global_step)


def preemption_checkpoint_path(trainer: Trainer) -> str:
    """``last.ckpt`` in the first ModelCheckpoint's directory (where ``fit(ckpt_path="last")``
    looks), else in ``default_root_dir``."""
    for callback in trainer.checkpoint_callbacks:
        if callback.dirpath is not None:
            return os.path.join(callback.dirpath, PREEMPTED_CHECKPOINT)
    return os.path.join(trainer.default_root_dir, PREEMPTED_CHECKPOINT)
