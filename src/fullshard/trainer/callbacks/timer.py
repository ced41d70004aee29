"""``Timer``: stop training once a duration has passed (``Trainer(max_time=...)``), as Lightning's.

[Note: a time limit, agreed without a per-step collective]
Lightning's Timer broadcasts rank 0's decision at the end of every training batch: a collective
per step. Here only global rank 0 reads its clock (a ``time.monotonic()`` call per check), and
the ranks agree on where to stop through the process group's key-value store, with the protocol
of [Note: preemption, agreed without a per-step collective] (fullshard.trainer.preemption), rank
0's expired clock taking the place of the signal:

1. At a check point (the end of a training batch that ends an accumulation window, or of an
   epoch for ``interval="epoch"``), rank 0 finds the time is up and sets the key ``request``.
2. A daemon thread in every other rank polls the store for it every :data:`POLL_S` seconds; once
   a rank knows, it publishes its position (the number of batches the fit has run) at its next
   check point, and goes on.
3. Once every rank has published, each stops at the first check point past the largest position
   published. Every accumulation window ends with a collective all ranks take part in (the
   gradient reduction), so no rank can be two windows ahead of another: all find that position
   in time and stop at the same step, and ``trainer.should_stop`` ends the fit there as an
   ``EarlyStopping`` stop would (epoch-end hooks run, ``ModelCheckpoint`` saves ``last.ckpt``).

Cost while the time is not up: a clock read on rank 0 and an attribute read on the others per
check point; the stop comes a few steps (at most about :data:`POLL_S` seconds) after the limit.
With one process the check is the clock read alone.

The elapsed training time is saved in checkpoints (``state_dict``, as Lightning's
``{"time_elapsed": {...}}``) and a resumed run counts on from it.
"""

from __future__ import annotations

import re
import threading
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from fullshard.errors import MisconfigurationError
from fullshard.rank_zero import rank_zero_info
from fullshard.trainer.callbacks.base import Callback

if TYPE_CHECKING:
    from fullshard.module import Module
    from fullshard.trainer.trainer import Trainer

POLL_S = 0.2  # how often a rank other than 0 looks for rank 0's stop request in the store
_STAGES = ("train", "sanity_check", "validate", "test", "predict")
_FORMAT = re.compile(r"^(\d+):(\d\d):(\d\d):(\d\d)$")


def parse_duration(duration: Any) -> timedelta | None:
    """``max_time``/``Timer(duration=)``: ``"DD:HH:MM:SS"``, a ``timedelta``, a dict of
    ``timedelta`` arguments, or None (no limit)."""
    if duration is None or isinstance(duration, timedelta):
        return duration
    if isinstance(duration, str):
        match = _FORMAT.match(duration.strip())
        if match is not None:
            days, hours, minutes, seconds = (int(g) for g in match.groups())
            return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    elif isinstance(duration, dict):
        try:
            return timedelta(**duration)
        except TypeError as err:
            raise MisconfigurationError(
                f"max_time={duration!r} is not a valid dict of timedelta arguments ({err}). Use keys such as "
                "'days', 'hours', 'minutes', 'seconds', e.g. {'hours': 12}."
            ) from None
    raise MisconfigurationError(
        f"max_time={duration!r} is invalid. Pass a string 'DD:HH:MM:SS' (e.g. '00:12:00:00' for 12 hours), a "
        "datetime.timedelta, a dict of timedelta arguments (e.g. {'hours': 12}), or None for no limit."
    )


class Timer(Callback):
    """Stops training once ``duration`` has passed, and measures the time of each stage.

    Args:
        duration: ``"DD:HH:MM:SS"``, a ``datetime.timedelta``, a dict of its arguments, or None
            (only measure).
        interval: check at the end of each training batch (``"step"``) or epoch (``"epoch"``).
        verbose: say when the limit stops training.

    The time is checked as Lightning's Timer checks it, but the ranks agree on the step without a
    collective per step (see [Note: a time limit, agreed without a per-step collective]).
    """

    _sessions = 0  # per process: every rank runs the same fits, so the same count names a fit

    def __init__(self, duration: Any = None, interval: str = "step", verbose: bool = True) -> None:
        limit = parse_duration(duration)
        if interval not in ("step", "epoch"):
            raise MisconfigurationError(
                f"Timer(interval={interval!r}) is invalid: use 'step' (check after each training batch) or 'epoch'."
            )
        self._duration = limit.total_seconds() if limit is not None else None
        self._interval = interval
        self._verbose = verbose
        self._start_time: dict[str, float | None] = dict.fromkeys(_STAGES)
        self._end_time: dict[str, float | None] = dict.fromkeys(_STAGES)
        self._offset = 0.0
        self._agreement: _StopAgreement | None = None

    # ------------------------------------------------------------------------------ queries
    def start_time(self, stage: str = "train") -> float | None:
        """When ``stage`` (``"train"``, ``"validate"``, ``"test"``) last started (``time.monotonic()``)."""
        return self._start_time[stage]

    def end_time(self, stage: str = "train") -> float | None:
        """When ``stage`` last ended (``time.monotonic()``), None while it runs."""
        return self._end_time[stage]

    def time_elapsed(self, stage: str = "train") -> float:
        """Seconds ``stage`` has run; for ``"train"`` with the time of the run a checkpoint resumed."""
        start, end = self._start_time[stage], self._end_time[stage]
        offset = self._offset if stage == "train" else 0.0
        if start is None:
            return offset
        return (time.monotonic() if end is None else end) - start + offset

    def time_remaining(self, stage: str = "train") -> float | None:
        """Seconds left of ``duration`` (None without a duration)."""
        return None if self._duration is None else self._duration - self.time_elapsed(stage)

    # -------------------------------------------------------------------------------- hooks
    def on_fit_start(self, trainer: Trainer, pl_module: Module) -> None:
        # a resumed run whose checkpoint already used up the time trains no further (as Lightning);
        # every rank loaded the same elapsed time, so they agree without asking each other
        if self._duration is not None and self._offset >= self._duration:
            trainer.should_stop = True

    def on_train_start(self, trainer: Trainer, pl_module: Module) -> None:
        self._start_time["train"], self._end_time["train"] = time.monotonic(), None
        if self._duration is not None:
            Timer._sessions += 1
            self._agreement = _StopAgreement(trainer, f"fullshard/timer/{Timer._sessions}")

    def on_train_end(self, trainer: Trainer, pl_module: Module) -> None:
        self._end_time["train"] = time.monotonic()
        self._close()

    def on_exception(self, trainer: Trainer, pl_module: Module, exception: BaseException) -> None:
        self._close()

    def on_validation_start(self, trainer: Trainer, pl_module: Module) -> None:
        self._start_time["validate"], self._end_time["validate"] = time.monotonic(), None

    def on_validation_end(self, trainer: Trainer, pl_module: Module) -> None:
        self._end_time["validate"] = time.monotonic()

    def on_test_start(self, trainer: Trainer, pl_module: Module) -> None:
        self._start_time["test"], self._end_time["test"] = time.monotonic(), None

    def on_test_end(self, trainer: Trainer, pl_module: Module) -> None:
        self._end_time["test"] = time.monotonic()

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: Module, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._interval != "step" or self._agreement is None:
            return
        if (batch_idx + 1) % trainer.accumulate_grad_batches == 0 or trainer.is_last_batch:  # a step boundary
            self._check(trainer)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: Module) -> None:
        if self._interval == "epoch" and self._agreement is not None:
            self._check(trainer)

    def state_dict(self) -> dict[str, Any]:
        return {"time_elapsed": {stage: self.time_elapsed(stage) for stage in _STAGES}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._offset = float(state_dict.get("time_elapsed", {}).get("train", 0.0))

    # ----------------------------------------------------------------------------- helpers
    def _check(self, trainer: Trainer) -> None:
        agreement = self._agreement
        assert agreement is not None and self._duration is not None
        if not agreement.requested and agreement.rank == 0 and self.time_elapsed() >= self._duration:
            agreement.request()
        if agreement.requested and agreement.should_stop(trainer.fit_loop.progress.total_batch_idx):
            if not trainer.should_stop and self._verbose:
                elapsed = timedelta(seconds=int(self.time_elapsed()))
                rank_zero_info(f"Time limit reached. Elapsed time is {elapsed}. Signaling Trainer to stop.")
            trainer.should_stop = True

    def _close(self) -> None:
        if self._agreement is not None:
            self._agreement.close()
            self._agreement = None


class _StopAgreement:
    """Rank 0's request to stop, agreed by every rank at one position (see [Note: a time limit,
    agreed without a per-step collective])."""

    def __init__(self, trainer: Trainer, prefix: str) -> None:
        strategy = trainer.strategy
        self.rank, self.world_size = strategy.global_rank, strategy.world_size
        self.requested = False
        self._prefix = prefix
        self._store = strategy.key_value_store() if self.world_size > 1 else None
        self._published = False
        self._latest: int | None = None
        self._stop_poll: threading.Event | None = None
        if self._store is not None and self.rank != 0:
            self._stop_poll = threading.Event()
            threading.Thread(
                target=self._poll, args=(self._stop_poll,), name="fullshard-timer", daemon=True
            ).start()

    def request(self) -> None:
        """Rank 0's clock says stop."""
        self.requested = True
        if self._store is not None:
            self._store.set(f"{self._prefix}/request", "1")

    def should_stop(self, position: int) -> bool:
        """At a check point once ``requested``: True at the one every rank stops at."""
        store = self._store
        if store is None:
            return True
        if not self._published:
            store.set(f"{self._prefix}/position/{self.rank}", str(position))
            self._published = True
        if self._latest is None:
            keys = [f"{self._prefix}/position/{rank}" for rank in range(self.world_size)]
            if not store.check(keys):
                return False
            self._latest = max(int(store.get(k)) for k in keys)
        return position > self._latest

    def close(self) -> None:
        if self._stop_poll is not None:
            self._stop_poll.set()
            self._stop_poll = None
        self._store = None

    def _poll(self, stop: threading.Event) -> None:
        key = f"{self._prefix}/request"
        while not stop.wait(POLL_S):
            try:
                if self._store is not None and self._store.check([key]):
                    self.requested = True
                    return
            except Exception:  # the store went away (the job is ending): nothing to agree on
                return
