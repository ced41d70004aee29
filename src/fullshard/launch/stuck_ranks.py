"""Stuck ranks: end a job whose rank stopped making progress, naming the rank and where it is.

[Note: stuck ranks]
A rank that stops making progress (it sleeps, deadlocks, or waits in a collective the other
ranks never call) fails nothing: the others wait for it in their next collective until the
process group's timeout (30 minutes by default), and then report a timeout that does not say
which rank was stuck or where. So each process runs a watchdog thread:

- The training and evaluation loops *kick* it once per batch (:func:`kick`): three attribute
  writes and a comparison, no collective, no lock (about 140 ns; benchmarks/stuck_ranks.py). A launched function's end (``fit``,
  ``validate``, ... returning, see :func:`launched`) *rests* it until the next kick, and
  checkpoint I/O *pauses* it (:func:`paused`), so the time a user spends outside the loops,
  setup, and saving or loading a checkpoint are never timed. With ``compile``, the first
  batch of each stage (where torch.compile compiles) is not timed either.
- Every ``heartbeat`` seconds the thread publishes this rank's progress (batches begun, the
  last one, seconds since) and where its main thread is (innermost frame, and whether that is
  inside torch, as a rank waiting in a collective is) to the process group's key-value store,
  from its own connection: a main thread blocked in a store call cannot block it.
- It reads every rank's heartbeat twice, at least ``2 * heartbeat`` apart (a rank whose
  heartbeat did not move is *silent*: gone, stopped, or holding the GIL in native code): first
  once its own main thread has gone ``first_reading`` (``timeout - 2 * heartbeat - 2 * tick``)
  without a kick, then exactly when it has gone ``timeout``. So the verdict lands at the
  timeout, not two heartbeats and a tick after it, and nothing is decided before it: a kick, a
  pause or a rest in between cancels the check. The ranks *behind* are the silent ones, else
  those that began the fewest batches; on a tie, those not waiting inside torch.
- A rank that is behind writes its own stack (all its threads) to stderr under a header naming
  it, publishes a last heartbeat in state ``stuck``, and ends with exit code 1; the launcher
  then ends the job as on any failure ([Note: a failure ends the job] in
  fullshard.launch.launchers; a stuck rank 0 SIGKILLs the processes it started half a second
  after SIGTERM, see ``end_job``). A rank that is not behind says which rank it waits for and
  where that rank is, and ends itself as soon as that rank's heartbeat says ``stuck`` (or the
  store is gone: its host, rank 0, ended). Under torchrun and ``srun --kill-on-bad-exit`` that
  is what ends it promptly: their SIGTERM does not, since inside ``fit`` it only asks for a
  preemption checkpoint at the next step (fullshard.trainer.preemption), and a rank in a C++
  collective runs no Python handler at all; they would SIGKILL it 30 s later. Failing that, it
  ends itself ``grace`` (1 to 5 s) after the ranks behind were due to report themselves (their
  own ``timeout`` after their last batch began, from their heartbeat's ``idle``; at once for a
  silent rank, which cannot), so that a silent rank cannot keep the job alive either.

Timing (:class:`Timing`; ``latest_verdict``): the thread looks every ``tick`` (``timeout / 20``,
0.05 to 1 s) and publishes every ``heartbeat`` (``timeout / 10``, 0.2 to 10 s); its waits for the
second reading end at their deadline, not at the next tick. The stuck rank reports ``timeout``
after its last batch began, plus the store's and the scheduler's latency (milliseconds), unless
the thread noticed ``first_reading`` so late (a slow store call) that the floor of ``2 *
heartbeat`` between the readings pushes the second one later. With the default 5 minutes: the
first reading at 278 s, the report at 300 s (it was 320 to 321 s). The job then ends as soon as
the launcher sees the stuck rank exit (fullshard's looks every 0.2 s, and a stuck rank 0 ends its
children within 0.5 s: it was 3 s), and a rank waiting for it ends itself at its own verdict at
the latest (its own ``timeout`` after its last batch began, about a batch after the stuck rank's:
under torchrun or srun it was 30 s). When the stuck rank is silent, its peers end the job by
305 s (it was 381 s).

Progress counts compare across ranks because every rank runs the same batches, and each
``fit`` / ``validate`` / ... starts a new watchdog on every rank (:func:`watch`, from the
strategy's ``setup_environment``). A rank
stopped in a debugger (pdb, debugpy) is never reported; a rank whose thread holds the GIL
cannot report itself, but its peers name it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType
from typing import TYPE_CHECKING, Any

from fullshard.errors import MisconfigurationError
from fullshard.launch.stuck_reports import (
    STUCK_EXIT_CODE,
    Heartbeat,
    Verdict,
    find_behind,
    format_threads,
    in_debugger,
    locate,
    ranks_text,
    reported_stuck,
    seconds_text,
    stuck_report,
    waiting_report,
)

if TYPE_CHECKING:
    from torch.distributed.distributed_c10d import Store

__all__ = [
    "DEFAULT_STUCK_RANK_TIMEOUT",
    "Heartbeat",
    "StuckRankWatchdog",
    "Timing",
    "check_stuck_rank_timeout",
    "find_behind",
    "kick",
    "launched",
    "paused",
    "stop_watching",
    "watch",
]

log = logging.getLogger(__name__)

DEFAULT_STUCK_RANK_TIMEOUT = timedelta(minutes=5)
_KEY_PREFIX = "fullshard/stuck_ranks"


def check_stuck_rank_timeout(value: Any) -> timedelta | None:
    """``stuck_rank_timeout`` as given, when it is a positive ``timedelta`` or None."""
    if value is None or (isinstance(value, timedelta) and value > timedelta(0)):
        return value
    raise MisconfigurationError(
        f"stuck_rank_timeout must be a positive datetime.timedelta or None (no check), got {value!r}."
        " For example: stuck_rank_timeout=datetime.timedelta(minutes=5), the default."
    )


@dataclass(frozen=True)
class Timing:
    """The watchdog's intervals, all derived from ``timeout`` (seconds); see [Note: stuck ranks]."""

    timeout: float

    @property
    def tick(self) -> float:
        """How often the thread looks at its own main thread (and publishes when due)."""
        return min(max(self.timeout / 20, 0.05), 1.0)

    @property
    def heartbeat(self) -> float:
        """How often a rank publishes its heartbeat."""
        return min(max(self.timeout / 10, 0.2), 10.0)

    @property
    def first_reading(self) -> float:
        """How long the main thread goes without a kick before the first reading of the
        heartbeats: early enough that the second one, at least ``2 * heartbeat`` later, still falls
        on ``timeout`` when the thread notices up to a tick late (a margin of two ticks)."""
        return max(self.timeout - 2 * self.heartbeat - 2 * self.tick, 0.0)

    @property
    def latest_verdict(self) -> float:
        """The latest time after the last kick at which a rank decides who is stuck, and the stuck
        one reports (plus the store's and the scheduler's latency): the second reading comes at
        ``timeout``, or ``2 * heartbeat`` after a first reading made at most a tick late."""
        return max(self.timeout, self.first_reading + self.tick + 2 * self.heartbeat)

    @property
    def grace(self) -> float:
        """How long a rank waiting for stuck peers gives them, past the moment they are due to
        report themselves, before it ends itself."""
        return min(max(self.timeout / 50, 1.0), 5.0)


# ---------------------------------------------------------------------------------------------
# Where a thread is


class StuckRankWatchdog:
    """The watchdog thread of one process; see [Note: stuck ranks].

    Args:
        rank, world_size: this process's global rank and the job's size.
        timeout: how long this process's main thread may go without beginning a batch.
        store: a key-value store every rank reaches (its own connection: see the note).
        untimed_first_batch: leave the first batch of each stage untimed (``compile``).
        end_process: ends this process (and those it started) with the given exit code.
    """

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        timeout: timedelta,
        store: Store,
        untimed_first_batch: bool,
        end_process: Callable[[int], object],
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.timing = Timing(timeout.total_seconds())
        self.untimed_first_batch = untimed_first_batch
        self._store = store
        self._end_process = end_process
        self._host = socket.gethostname()
        # Written by the main thread (kick, rest, paused), read by the watchdog thread.
        self._kicks = 0
        self._last_kick = time.monotonic()
        self._batch = -1
        self._stage: str | None = None
        self._last_stage: str | None = None
        self._resting = True
        self._paused = 0
        self._untimed_kick = -1  # the interval after this many kicks is not timed
        self._stages_seen: set[str] = set()
        self._main = threading.main_thread().ident
        # The watchdog thread's own.
        self._stuck = False  # this rank reported itself stuck and is ending
        self._seq = 0
        self._next_beat = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -------------------------------------------------------------------- the main thread's side
    def kick(self, stage: str, batch_idx: int) -> None:
        """The main thread begins batch ``batch_idx`` of ``stage``: the hot path, keep it lean."""
        self._last_kick = time.monotonic()
        self._kicks += 1
        self._batch = batch_idx
        if stage != self._stage:
            self._enter_stage(stage)

    def _enter_stage(self, stage: str) -> None:
        self._stage = self._last_stage = stage
        self._main = threading.get_ident()
        self._resting = False
        if self.untimed_first_batch and stage not in self._stages_seen:
            self._stages_seen.add(stage)
            self._untimed_kick = self._kicks

    def rest(self) -> None:
        """Stop timing until the next batch begins (the launched function returned)."""
        self._resting = True
        self._stage = None  # the next kick takes the slow path, which ends the rest
        self._stages_seen.clear()  # a new run compiles anew

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Do not time what runs inside (checkpoint I/O); the clock restarts when it ends."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1
            self._last_kick = time.monotonic()

    # ------------------------------------------------------------------- the watchdog's side
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fullshard-stuck-rank-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    @property
    def _key(self) -> str:
        return f"{_KEY_PREFIX}/rank{self.rank}"

    def _state(self) -> str:
        if self._stuck:
            return "stuck"
        return "resting" if self._resting else "paused" if self._paused else "running"

    def _main_frame(self) -> FrameType | None:
        return sys._current_frames().get(self._main) if self._main is not None else None

    def heartbeat(self) -> Heartbeat:
        """This rank's heartbeat now."""
        where, in_torch = locate(self._main_frame())
        return Heartbeat(
            rank=self.rank,
            pid=os.getpid(),
            host=self._host,
            seq=self._seq,
            kicks=self._kicks,
            stage=self._last_stage,
            batch=self._batch,
            idle=round(time.monotonic() - self._last_kick, 3),
            state=self._state(),
            where=where,
            in_torch=in_torch,
        )

    def publish(self) -> Heartbeat:
        self._seq += 1
        beat = self.heartbeat()
        self._store.set(self._key, beat.to_json())
        return beat

    def read_all(self, ranks: Iterable[int] | None = None) -> dict[int, Heartbeat | None]:
        """The last heartbeat of every rank (of ``ranks``), None where there is none; never waits
        for a missing key."""
        beats: dict[int, Heartbeat | None] = {}
        for rank in range(self.world_size) if ranks is None else ranks:
            key = f"{_KEY_PREFIX}/rank{rank}"
            beats[rank] = Heartbeat.from_json(self._store.get(key)) if self._store.check([key]) else None
        return beats

    def overdue(self, after: float | None = None) -> bool:
        """Whether the main thread has gone ``after`` seconds (``timeout`` by default) without
        beginning a batch while timed."""
        if self._resting or self._paused or self._kicks == self._untimed_kick:
            return False
        limit = self.timing.timeout if after is None else after
        if time.monotonic() - self._last_kick < limit:
            return False
        return not in_debugger(self._main_frame())

    def _run(self) -> None:
        while not self._stop.wait(self.timing.tick):
            try:
                self._publish_when_due()
                if self.overdue(self.timing.first_reading) and self.check_peers():
                    return
            except Exception as error:  # the store may be gone at the end of a job: never fail for it
                log.debug("stuck-rank watchdog: %s", error)

    def _publish_when_due(self) -> None:
        if time.monotonic() >= self._next_beat:
            self.publish()
            self._next_beat = time.monotonic() + self.timing.heartbeat

    def _wait_unless_progress(self, until: float, kicks: int) -> bool:
        """Wait until ``time.monotonic()`` reaches ``until``, publishing heartbeats as usual; False
        as soon as the main thread made progress (or went untimed), or the watchdog stops."""
        while (left := until - time.monotonic()) > 0:
            if self._stop.wait(min(self.timing.tick, left)):
                return False
            if self._kicks != kicks or not self.overdue(self.timing.first_reading):
                return False
            with contextlib.suppress(Exception):
                self._publish_when_due()
        return True

    def check_peers(self) -> bool:
        """This rank's main thread has gone ``first_reading`` without a kick: read every rank's
        heartbeat now and again when it has gone ``timeout``, find who is behind, report, and end
        this process. Returns True when the process was asked to end, False when the main thread
        made progress meanwhile (see [Note: stuck ranks])."""
        kicks, last_kick = self._kicks, self._last_kick
        try:
            self.publish()
            first = self.read_all()
        except Exception as error:  # no store (its host is gone): this rank cannot tell, so it ends
            if not self._wait_unless_progress(last_kick + self.timing.timeout, kicks):
                return False
            self._report_alone(error)
            return True
        # At ``timeout`` after the last kick, and never less than ``2 * heartbeat`` after the first
        # reading (a rank that is alive publishes within that), so that silent ranks are told apart.
        second_at = max(last_kick + self.timing.timeout, time.monotonic() + 2 * self.timing.heartbeat)
        if not self._wait_unless_progress(second_at, kicks):
            return False
        try:
            own = self.publish()
            second = self.read_all()
        except Exception as error:
            self._report_alone(error)
            return True
        if self._kicks != kicks:  # a batch began while reading: nothing is stuck
            return False
        ended = [rank for rank, beat in second.items() if beat is not None and beat.state == "stuck"]
        if ended:  # a peer found itself stuck and ended (or is ending): so does the job
            self._end(reported_stuck(ended))
            return True
        verdict = find_behind(self.rank, first, second)
        if self.rank in verdict.behind:
            others = [beat for rank, beat in sorted(second.items()) if rank != self.rank and beat is not None]
            _write(stuck_report(own, others, self.timing.timeout, self._stacks()))
            self._stuck = True
            with contextlib.suppress(Exception):  # the peers waiting for this rank end at once
                self.publish()
            self._end_process(STUCK_EXIT_CODE)
            return True
        wait = round(self._wait_for_behind(verdict, second), 1)
        _write(waiting_report(own, verdict, second, wait))
        why = self._await_end_of_behind(verdict, wait, kicks)
        if why is None:
            return False
        self._end(why)
        return True

    def _wait_for_behind(self, verdict: Verdict, beats: Mapping[int, Heartbeat | None]) -> float:
        """How long a rank that is not behind waits before ending itself: until the ranks behind
        that still publish are due to report themselves (their own ``timeout`` after their last
        batch began), then ``grace``. A silent rank reports nothing: only ``grace`` for it."""
        due = [
            self.timing.timeout - beat.idle
            for rank in verdict.behind
            if rank not in verdict.silent and (beat := beats.get(rank)) is not None
        ]
        return max([0.0, *due]) + self.timing.grace

    def _await_end_of_behind(self, verdict: Verdict, wait: float, kicks: int) -> str | None:
        """Wait, publishing as usual, until the ranks behind have ended (they publish a last
        heartbeat in state 'stuck'), the store is gone (its host, rank 0, ended), or ``wait``
        seconds have passed: why this rank ends now; None when the main thread made progress or
        the watchdog stops."""
        until = time.monotonic() + wait
        while True:
            try:
                beats = self.read_all(verdict.behind)
            except Exception as error:
                return f"the store is gone ({type(error).__name__}: {error}): the job is ending"
            ended = [rank for rank, beat in beats.items() if beat is not None and beat.state == "stuck"]
            if ended:
                return reported_stuck(ended)
            if time.monotonic() >= until:
                return f"the job did not end within {seconds_text(wait)} of finding {ranks_text(verdict.behind)} behind"
            if not self._wait_unless_progress(min(time.monotonic() + self.timing.tick, until), kicks):
                return None

    def _end(self, why: str) -> None:
        _write(f"fullshard: ending rank {self.rank}: {why}.\n")
        self._end_process(STUCK_EXIT_CODE)

    def _stacks(self) -> str:
        names = {thread.ident: thread.name for thread in threading.enumerate() if thread.ident is not None}
        return format_threads(sys._current_frames(), names, self._main, skip=threading.get_ident())

    def _report_alone(self, error: Exception) -> None:
        own = self.heartbeat()
        note = (
            f"fullshard: the other ranks' heartbeats could not be read ({type(error).__name__}: {error});"
            " the process hosting the store (rank 0) may be gone.\n"
        )
        _write(stuck_report(own, [], self.timing.timeout, self._stacks()) + note)
        self._end_process(STUCK_EXIT_CODE)


def _write(text: str) -> None:
    stream = sys.stderr if sys.stderr is not None else sys.__stderr__
    if stream is not None:
        stream.write(text)  # one write, so that other ranks' lines do not land inside it
        stream.flush()


# ---------------------------------------------------------------------------------------------
# This process's watchdog


_active: StuckRankWatchdog | None = None


def kick(stage: str, batch_idx: int) -> None:
    """The loop of ``stage`` (``"train"``, ``"validate"``, ``"test"``, ``"predict"``) begins
    batch ``batch_idx``; nothing happens unless a strategy started a watchdog in this process."""
    watchdog = _active
    if watchdog is not None:
        watchdog.kick(stage, batch_idx)


def watch(
    *,
    rank: int,
    world_size: int,
    timeout: timedelta,
    store: Store,
    untimed_first_batch: bool,
    end_process: Callable[[int], object],
) -> StuckRankWatchdog:
    """Start this process's watchdog (replacing one started before)."""
    global _active
    stop_watching()
    _active = StuckRankWatchdog(
        rank=rank,
        world_size=world_size,
        timeout=timeout,
        store=store,
        untimed_first_batch=untimed_first_batch,
        end_process=end_process,
    )
    _active.start()
    return _active


def stop_watching() -> None:
    """Stop this process's watchdog, if any."""
    global _active
    watchdog, _active = _active, None
    if watchdog is not None:
        watchdog.stop()


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Leave what runs inside untimed (checkpoint I/O)."""
    watchdog = _active
    if watchdog is None:
        yield
        return
    with watchdog.paused():
        yield


@contextlib.contextmanager
def launched() -> Iterator[None]:
    """Around a launched function (``fit``, ``validate``, ...) in the process that runs it: when it
    ends, however it ends, nothing is timed until the next batch begins."""
    try:
        yield
    finally:
        watchdog = _active
        if watchdog is not None:
            watchdog.rest()
