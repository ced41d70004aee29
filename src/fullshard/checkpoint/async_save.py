"""Sharded checkpoints written in the background: ``FSDP2Strategy(async_save=True)``.

A sharded save (``fullshard.checkpoint.engine``, on every rank at the same point of the program)
plans this rank's host copy of the model and optimizer state (:func:`fullshard.checkpoint.staging.stage`:
buffers copied now, parameters and optimizer state only referenced) and pickles ``meta.pt``
(:func:`serialize`); :meth:`BackgroundSaves.start` hands them to a thread of this process and
returns, and training goes on while the thread copies the rest and writes. Until the copy is
done, the optimizers wait at the start of their ``step`` ([Note: staging off the training
thread] in staging.py). A :class:`~fullshard.checkpoint.checkpointer.Checkpointer` (the
Trainer's, owned by its :class:`~fullshard.checkpoint.manager.CheckpointManager`, or a
strategy's own without a Trainer) owns the :class:`BackgroundSaves` and keeps the
:class:`PendingSave` it returns, and waits for it (:func:`finish`) before every save and load,
at the end of ``fit`` and when ``fit`` fails; an ``atexit`` function waits when the
process exits. While a save is pending, the fit loop calls
:meth:`PendingSave.step_boundary` after each optimizer step: an attribute write and read (and
once, the removal of the optimizers' wait), unless the save has failed.

[Note: asynchronous commit]
The background thread of every rank runs the steps of a synchronous sharded save (see
[Note: directory commit] in layout.py), on a gloo process group of its own (:meth:`BackgroundSaves.group`) so
that its collectives never interleave with the training collectives of the default group:

0. copy the parameters and optimizer state to host memory, check the copy's parameters for NaN
   and inf, make the save's ``data-<id>`` directory (rank 0; the main thread chose its name),
   and exchange with every rank whether that worked (one ``all_gather_object``): if any rank
   failed or found non-finite weights, none writes, and the save fails;
1. write this rank's shards with ``torch.distributed.checkpoint`` into the save's fresh
   ``data-<id>`` directory (rank 0 also writes ``.metadata``), fsync them, and write beside them
   this rank's record of their sizes and CRC-32s (``fullshard.checkpoint.commit.write_shards``);
2. exchange with every rank whether it failed, and why (one ``all_gather_object`` of a list that
   is empty when all went well: no file names or checksums travel);
3. if every rank succeeded, rank 0 writes ``meta.pt`` (pickled by the main thread when the save
   was called), fsyncs it and ``.metadata``, and renames the commit record into place; it then
   tells every rank whether that worked (one broadcast).

The commit record is renamed only after every rank's files are on disk, so a process killed at
any moment (any rank) leaves the record naming the previous save's directory: the previous
checkpoint loads and the partial directory is invisible, removed by the next save to the path.
Every rank knows the outcome after step 3.

[Note: failures surface at the same step on every rank]
A failure must be raised on every rank at the same point, or the ranks that raise leave the
others waiting in the next collective. The threads know the outcome at about the same time, but
each main thread looks at it at its own next optimizer step, and the ranks can be a step apart.
So a failed save is reported at a step the ranks agree on:

- the thread sets ``_hold`` and only then reads ``_step``, the last optimizer step its main
  thread reached (:meth:`PendingSave.step_boundary` writes it before reading ``_hold``);
- the threads all-gather those steps and choose ``T = max + 1``: a main thread that already saw
  ``_hold`` was read at its current step or the one before, one that did not has gone no
  further than the step read, so no rank is past ``T``;
- a main thread that sees ``_hold`` waits (for the one exchange) for ``T`` and raises at step
  ``T``. It cannot wait long: the exchange needs only the threads, not the main threads.

A run that ends before step ``T`` raises at the end of ``fit`` (or the next save) instead, which
every rank reaches too. When the exchange itself fails (a peer died) there is nothing to agree
with, and each rank raises at its next step.
"""

from __future__ import annotations

import atexit
import dataclasses
import io
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from fullshard.checkpoint.events import checkpoint_event
from fullshard.checkpoint.staging import Staging, StagingBuffers, StepGuard
from fullshard.errors import CheckpointError

if TYPE_CHECKING:
    from fullshard.checkpoint.host import CheckpointHost

Write = Callable[[Any, Any], None]  # (staged state, process group or None): this rank's shards and record
Commit = Callable[[], None]  # once every rank wrote: meta.pt and the commit record (rank 0)


@dataclasses.dataclass(frozen=True)
class SaveSteps:
    """What the background thread runs for one save, in this order (the engine fills them in)."""

    check: Callable[[Any], None]  # raises when the copy must not be written (non-finite weights)
    prepare: Callable[[], None]  # makes the save's data directory (rank 0; the others' do nothing)
    write: Write
    commit: Commit


# -------------------------------------------------------------------------------------- staging
def serialize(obj: Any) -> bytes:
    """``torch.save(obj)`` into memory: the state as it is now, whatever training changes next."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


# ------------------------------------------------------------------------------ the save itself
class PendingSave:
    """One checkpoint being written by a thread of this process (see [Note: asynchronous commit])."""

    def __init__(
        self,
        path: Path,
        step: int,
        staging: Staging,
        steps: SaveSteps,
        group: Any,
        rank: int,
        world_size: int,
        unfinished: set[PendingSave],
        guard: StepGuard | None = None,
    ) -> None:
        self.path = path
        self.staged_bytes = staging.nbytes  # this rank's host copy, until the files are written
        self._staging = staging  # its copy is released once written (or the save failed)
        self._guard = guard  # the optimizers' wait for the copy (main thread); None once removed
        self._copy_waited = 0.0
        self._steps: SaveSteps | None = steps  # dropped when done, with what they hold (meta.pt)
        self._group = group
        self._rank = rank
        self._world_size = world_size
        self._unfinished = unfinished  # its owner's saves that atexit waits for, until taken
        self._save_step = step
        # [Note: failures surface at the same step on every rank]
        self._step = step  # the last optimizer step the main thread reached (written by it)
        self._hold = False  # set by the thread when the save failed, before it reads _step
        self._raise_at = 0  # the step at which the main thread raises the failure
        self._peers_reachable = True  # False once a collective of the thread failed
        self._decided = threading.Event()
        self._failure: str | None = None  # the causes, once known; None when committed
        self._reported = False
        self._lock = threading.Lock()
        self._finished = False
        self._after_commit: list[Callable[[], None]] = []
        self._thread = threading.Thread(target=self._run, name="fullshard-async-save", daemon=True)

    # -------------------------------------------------------------------- main thread
    def step_boundary(self, step: int) -> None:
        """Called by the host after each optimizer step (``step``: the steps taken). Raises the
        save's failure at the step every rank agreed on."""
        self._step = step
        if self._guard is not None and self._guard.done():
            self.wait_for_copy()  # returns at once; the optimizers step without looking from now on
        if self._hold:
            self._decided.wait()  # the threads are exchanging their steps: one small collective
            if step >= self._raise_at and not self._reported:
                self._reported = True
                raise self._error(f" (Raised on every process at global step {step}.)")

    def wait_for_copy(self) -> None:
        """Return once this rank's state is copied (or the copy failed): from then on training may
        change parameters and optimizer state in place. No collective."""
        guard = self._guard
        if guard is not None:
            guard.wait()
            guard.remove()
            self._guard = None
            self._copy_waited += guard.waited_s

    def begin(self) -> None:
        """Start the thread that finishes the copy and writes (once, by :meth:`BackgroundSaves.start`)."""
        self._thread.start()

    def abandon(self) -> None:
        """Let the optimizers step without waiting: the save is dropped before :meth:`begin`."""
        if self._guard is not None:
            self._guard.remove()
            self._guard = None

    @property
    def copy_wait_s(self) -> float:
        """Seconds the optimizer steps of this process waited for the copy so far."""
        return self._copy_waited + (self._guard.waited_s if self._guard is not None else 0.0)

    def join(self) -> None:
        """Wait until the thread is done (the checkpoint committed, or the save failed)."""
        self._thread.join()
        self.wait_for_copy()

    def raise_if_failed(self) -> None:
        """Raise the failure, once, if no step boundary raised it yet."""
        self._unfinished.discard(self)
        if self._failure is not None and not self._reported:
            self._reported = True
            raise self._error("")

    def after_commit(self, action: Callable[[], None]) -> None:
        """Run ``action`` once the checkpoint is committed (now, if it is); never if the save fails."""
        with self._lock:
            if not self._finished:
                self._after_commit.append(action)
                return
        if self._failure is None:
            _run_action(action)

    def _error(self, when: str) -> CheckpointError:
        return CheckpointError(
            f"The checkpoint written in the background to {str(self.path)!r} at global step {self._save_step} "
            f"failed: {self._failure}. Nothing of it was committed: the checkpoint previously at that path, if "
            f"any, is intact and loads.{when} Fix the cause (free disk space, check the path's permissions) and "
            "save again; the next save to this path removes the partial files."
        )

    # ------------------------------------------------------------- background thread
    def _run(self) -> None:
        try:
            causes = self._write_and_commit()
        except BaseException as err:  # a bug here must still release the main thread
            causes = [_cause(err, self._rank)]
        self._failure = "; ".join(causes) if causes else None
        self._steps = None
        if causes:
            self._agree_on_step()
        with self._lock:
            self._finished = True
            actions, self._after_commit = self._after_commit, []
        if not causes:
            for action in actions:
                _run_action(action)
        checkpoint_event("async.finished")

    def _write_and_commit(self) -> list[str]:
        staging, steps = self._staging, self._steps
        if steps is None:
            raise RuntimeError("a background save writes and commits once")
        causes = self._copy(staging, steps)
        if causes:
            return causes
        try:
            checkpoint_event("async.writing")  # nothing read from the staged copy yet
            steps.write(staging.state, self._group)
        except BaseException as err:  # DCP's CheckpointException is a BaseException
            causes = _causes(err, self._rank)
        finally:
            staging.release()  # the files hold it now, or the save failed: free the host copy
        checkpoint_event("async.written")
        try:
            reports = self._all_gather(causes)
        except Exception as err:  # a peer died or timed out: there is nobody to agree with
            self._peers_reachable = False
            return [*causes, _cause(err, self._rank, "while exchanging results")]
        causes = list(dict.fromkeys(c for rank_causes in reports for c in rank_causes))
        if causes:
            return causes
        commit_causes: list[str] = []
        if self._rank == 0:
            try:
                steps.commit()
            except BaseException as err:
                commit_causes = _causes(err, 0)
        try:
            committed: list[str] = self._broadcast(commit_causes)
            return committed
        except Exception as err:
            self._peers_reachable = False
            return [_cause(err, self._rank, "while learning whether rank 0 committed")]

    def _copy(self, staging: Staging, steps: SaveSteps) -> list[str]:
        """Step 0 of [Note: asynchronous commit]: this rank's copy, its check, the data directory
        (rank 0), and every rank's outcome of them. A rank whose copy failed cannot write, and
        DCP's collectives need every rank: so if any failed, none writes."""
        causes: list[str] = []
        try:
            staging.copy()  # releases the optimizer steps waiting for it, copied or not
        except BaseException as err:
            causes = [_cause(err, self._rank, "while copying the state to host memory")]
        else:
            try:
                steps.check(staging.state)
                steps.prepare()
            except BaseException as err:
                causes = [_cause(err, self._rank)]
        try:
            reports = self._all_gather(causes)
        except Exception as err:
            self._peers_reachable = False
            reports = [[*causes, _cause(err, self._rank, "while exchanging results")]]
        causes = list(dict.fromkeys(c for rank_causes in reports for c in rank_causes))
        if causes:
            staging.release()
        return causes

    def _agree_on_step(self) -> None:
        # [Note: failures surface at the same step on every rank]: _hold before reading _step
        self._hold = True
        try:
            if self._peers_reachable:  # else raise at the next step: there is nobody to agree with
                self._raise_at = max(self._all_gather(self._step)) + 1
        except Exception:
            self._raise_at = 0
        finally:
            self._decided.set()

    def _all_gather(self, obj: Any) -> list[Any]:
        if self._group is None:
            return [obj]
        import torch.distributed as dist

        gathered: list[Any] = [None] * self._world_size
        dist.all_gather_object(gathered, obj, group=self._group)
        return gathered

    def _broadcast(self, obj: Any) -> Any:
        if self._group is None:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self._group)
        return box[0]


def _run_action(action: Callable[[], None]) -> None:
    """Run an after-commit action (ModelCheckpoint deleting what the new checkpoint replaces): its
    failure leaves a file behind, not a training run to stop, so it is a warning."""
    try:
        action()
    except Exception as err:
        warnings.warn(f"After committing a checkpoint, {action!r} failed: {err}", stacklevel=2)


def _cause(err: BaseException, rank: int, context: str = "") -> str:
    where = f"rank {rank}" + (f" {context}" if context else "")
    return f"{where}: {type(err).__name__}: {err}"


def _causes(err: BaseException, rank: int) -> list[str]:
    """One line per rank that failed; DCP gathers its ranks' exceptions into one."""
    from torch.distributed.checkpoint.api import CheckpointException

    if isinstance(err, CheckpointException):
        return [_cause(exc, failed_rank) for failed_rank, (exc, _) in sorted(err.failures.items())]
    return [_cause(err, rank)]


# ----------------------------------------------------------------------- called by the engine
class BackgroundSaves:
    """What one owner's background saves share (the owner: a
    :class:`~fullshard.checkpoint.checkpointer.Checkpointer`, the Trainer's through its
    :class:`~fullshard.checkpoint.manager.CheckpointManager`): the gloo process group their
    threads communicate on, the pinned host buffers their copies reuse, and the saves whose
    outcome no main thread has taken yet, which an ``atexit`` function waits for.

    ``timeout``: the process group's (the strategy's ``timeout``; torch's default when None).
    """

    def __init__(self, timeout: timedelta | None = None) -> None:
        self._timeout = timeout
        self._group: Any = None  # created once, by every rank, at the first save of several processes
        self._buffers: StagingBuffers | None = None
        self._unfinished: set[PendingSave] = set()
        self._waits_at_exit = False

    def group(self, host: CheckpointHost) -> Any:
        """The gloo group for background collectives (None with one process)."""
        import torch.distributed as dist

        if host.world_size <= 1 or not dist.is_initialized():
            return None
        if self._group is None:
            # a collective of the default group: every rank makes its first async save at the same point
            self._group = dist.new_group(backend="gloo", timeout=self._timeout)
        return self._group

    @property
    def buffers(self) -> StagingBuffers:
        """The pinned host buffers the saves reuse for state on CUDA."""
        if self._buffers is None:
            self._buffers = StagingBuffers(pin=torch.cuda.is_available(), reuse=True)
        return self._buffers

    def start(
        self, host: CheckpointHost, path: Path, step: int, staging: Staging, steps: SaveSteps
    ) -> PendingSave:
        """Hand ``staging`` to a background thread that finishes the copy and runs ``steps``;
        return the save at once, for the owner to keep and :func:`finish`. Until the copy is done,
        every optimizer waits at the start of its ``step`` (see [Note: staging off the training
        thread] in staging.py).

        The caller has finished the previous save (:func:`finish`), so one staged copy exists at a time.
        """
        group = self.group(host)
        pending = PendingSave(
            path,
            step,
            staging,
            steps,
            group,
            host.global_rank,
            host.world_size,
            self._unfinished,
            guard=StepGuard(staging.copied) if staging.deferred else None,
        )
        if not self._waits_at_exit:
            # registered after the process group's teardown, so it runs before it (atexit is LIFO);
            # it holds the set, not this object
            atexit.register(_wait_at_exit, self._unfinished)
            self._waits_at_exit = True
        self._unfinished.add(pending)
        try:
            checkpoint_event("async.staged")
        except BaseException:  # a test's hook: leave no save behind that nothing will ever run
            self._unfinished.discard(pending)
            pending.abandon()
            raise
        pending.begin()
        return pending

    def unfinished(self) -> Sequence[PendingSave]:
        """The saves whose outcome no main thread has taken yet (for tests)."""
        return list(self._unfinished)


def finish(pending: PendingSave) -> None:
    """Wait for ``pending`` to be written and committed; raise its failure
    (:class:`~fullshard.errors.CheckpointError`) unless a step boundary did already.

    Every rank calls it at the same point (a save, a load, the end of ``fit``), and every rank
    knows the outcome, so every rank raises or none does.
    """
    pending.join()
    pending.raise_if_failed()


def _wait_at_exit(unfinished: set[PendingSave]) -> None:
    """Let the saves still running finish before the process exits; report the failures no
    main thread took (an exception raised here would not change the exit status)."""
    for pending in list(unfinished):
        pending.join()
        try:
            pending.raise_if_failed()
        except CheckpointError as err:
            print(f"fullshard: {err}", file=sys.stderr, flush=True)
