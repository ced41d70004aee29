"""The start and the end of a Trainer call (``fit``/``validate``/``test``/``predict``) in each
process: ``trainer.state`` (:mod:`fullshard.trainer.states`), and what a call that raises does
before the exception goes on, as Lightning's ``_call_and_handle_interrupt``.

[Note: Ctrl+C during a call]
A ``KeyboardInterrupt`` ends the call as Lightning's does: the status becomes ``INTERRUPTED``,
the callbacks' and the DataModule's ``on_exception`` run (``ModelCheckpoint(save_on_exception=
True)`` saves there), the loggers are finalized with ``"failed"``, and the call raises
``SystemExit(1)`` (its context is the ``KeyboardInterrupt``): a script that does not catch it
ends with status 1 and no traceback through the user's code. While that shutdown runs, a second
Ctrl+C is ignored (Lightning ignores SIGINT from then on; fullshard puts the handler back once
the shutdown is done). The stage stays where the interrupt came, as in Lightning.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from fullshard.rank_zero import rank_zero_info
from fullshard.trainer.loggers.dispatch import finalize_loggers
from fullshard.trainer.states import CALL_STAGES, TrainerFn, TrainerState, TrainerStatus

if TYPE_CHECKING:
    from fullshard.datamodule import DataModule
    from fullshard.trainer.hooks import Hooks
    from fullshard.trainer.trainer import Trainer


class TunerExit(Exception):
    """Raised by ``LearningRateFinder``/``BatchSizeFinder`` when the :class:`~fullshard.tuner.Tuner`
    started them: the search is done, and the Trainer ends the call without an error."""


def start(state: TrainerState, stage: str) -> None:
    """A call of ``stage`` (``"fit"``, ...) starts: it runs, in its first stage."""
    state.fn = TrainerFn(stage)
    state.status = TrainerStatus.RUNNING
    state.stage = CALL_STAGES[stage]


def handle_failure(trainer: Trainer, exception: BaseException, hooks: Hooks) -> None:
    """The call raised ``exception``: mark it interrupted, tell the strategy, the callbacks and
    the DataModule, let a background checkpoint commit and finalize the loggers with
    ``"failed"``. Raises ``SystemExit(1)`` after a ``KeyboardInterrupt`` ([Note: Ctrl+C during a
    call]); otherwise the caller re-raises ``exception``."""
    state = trainer.state
    state.status = TrainerStatus.INTERRUPTED
    ctrl_c = isinstance(exception, KeyboardInterrupt)
    if ctrl_c:
        rank_zero_info("\nDetected KeyboardInterrupt, attempting graceful shutdown ...")
    with _sigint_ignored(ctrl_c):
        trainer.strategy.on_exception(exception)
        hooks.call("on_exception", exception)
        if trainer.datamodule is not None:
            trainer.datamodule.on_exception(exception)
        trainer.checkpoint_manager.finish_after_failure(exception)
        finalize_loggers(trainer, "failed")
    if ctrl_c:
        raise SystemExit(1)
    trainer.metrics_collector.drop_uncommitted()  # [Note: committed metrics] in fullshard.trainer.metrics
    state.stage = None


def teardown(state: TrainerState, datamodule: DataModule | None, hooks: Hooks, stage: str) -> None:
    """The DataModule's, the callbacks' and the module's ``teardown(stage)``, unless the call
    failed: as Lightning, a call that raised ends with ``on_exception`` (:func:`handle_failure`)
    and no teardown hook, so a ``teardown`` that cleans up after a finished stage never runs on
    a half-done one."""
    if state.status == TrainerStatus.INTERRUPTED:
        return
    if datamodule is not None:
        datamodule.teardown(stage)
    hooks.call("teardown", stage)


def end(state: TrainerState) -> None:
    """After the teardown hooks: a call that did not raise has finished."""
    if state.status == TrainerStatus.RUNNING:
        state.status = TrainerStatus.FINISHED
        state.stage = None


@contextlib.contextmanager
def _sigint_ignored(ignore: bool) -> Iterator[None]:
    """SIGINT ignored inside (when ``ignore``, and only the main thread can set handlers)."""
    if not ignore or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
