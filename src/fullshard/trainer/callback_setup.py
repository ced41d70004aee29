"""The Trainer's callbacks: ``Trainer(callbacks=...)`` checked, with the defaults Lightning adds
(checkpointing, the ``max_time`` timer, the progress bar, the model summary), the module's
``configure_callbacks()`` merged in when a call starts, and Lightning's order (the concern of
Lightning's callback connector)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fullshard.errors import MisconfigurationError
from fullshard.rank_zero import rank_zero_info
from fullshard.trainer.argument_types import callback_list, check_directory
from fullshard.trainer.callbacks.base import Callback, Checkpoint
from fullshard.trainer.callbacks.model_checkpoint import ModelCheckpoint
from fullshard.trainer.callbacks.model_summary import ModelSummary, RichModelSummary
from fullshard.trainer.callbacks.progress_bar import ProgressBar, TQDMProgressBar
from fullshard.trainer.callbacks.rich_progress import RichProgressBar
from fullshard.trainer.callbacks.rich_support import rich_available
from fullshard.trainer.callbacks.timer import Timer, parse_duration


def build_callbacks(
    callbacks: Callback | Iterable[Callback] | None,
    checkpointing: bool,
    progress_bar: bool,
    max_time: Any = None,
    model_summary: bool = False,
) -> list[Callback]:
    """``Trainer(callbacks=...)`` checked, with the defaults added as Lightning adds them: a
    ModelCheckpoint, a :class:`Timer` for ``max_time``, the progress bar and the model summary
    (``RichProgressBar``/``RichModelSummary`` when ``rich`` is importable, else
    ``TQDMProgressBar``/``ModelSummary``), each unless one of its kind is given."""
    given = callback_list(callbacks)
    checkpoints = [cb for cb in given if isinstance(cb, Checkpoint)]  # OnExceptionCheckpoint counts
    for cb in checkpoints:
        check_directory(f"{type(cb).__name__}(dirpath=)", getattr(cb, "dirpath", None))
    if checkpoints and not checkpointing:
        names = ", ".join(type(cb).__name__ for cb in checkpoints)
        raise MisconfigurationError(
            f"Trainer was configured with enable_checkpointing=False (or barebones=True) and callbacks holding "
            f"{names}, which saves checkpoints (Lightning refuses it too). Remove the ModelCheckpoint from "
            "callbacks to save none, or drop enable_checkpointing=False."
        )
    if checkpointing and not checkpoints:
        given.append(ModelCheckpoint())
    if max_time is not None:
        if any(isinstance(cb, Timer) for cb in given):
            parse_duration(max_time)  # still checked
            rank_zero_info("Ignoring `Trainer(max_time=...)`, callbacks list already contains a Timer.")
        else:
            given.append(Timer(duration=max_time, interval="step"))
    use_rich = rich_available()
    bars = [cb for cb in given if isinstance(cb, ProgressBar)]
    if len(bars) > 1:
        raise MisconfigurationError(
            f"Trainer(callbacks=...) holds {len(bars)} progress bars ({', '.join(type(b).__name__ for b in bars)}); "
            "only one can draw. Keep one of them."
        )
    if bars and not progress_bar:
        raise MisconfigurationError(
            f"Trainer(enable_progress_bar=False) was given a {type(bars[0]).__name__} in callbacks. Remove the "
            "bar from callbacks to hide it, or leave enable_progress_bar at True to show it."
        )
    if progress_bar and not bars:
        given.append(RichProgressBar() if use_rich else TQDMProgressBar())
    if model_summary and not any(isinstance(cb, ModelSummary) for cb in given):
        given.append(RichModelSummary() if use_rich else ModelSummary())
    # As in Lightning, checkpointing callbacks act last, after every other callback.
    return _lightning_order(given)


def _lightning_order(callbacks: list[Callback]) -> list[Callback]:
    """Lightning's order: those with ``runs_first`` first (the tuner's, whose search runs before the
    others' ``on_fit_start``), checkpointing callbacks last, the rest as given."""
    first = sorted((cb for cb in callbacks if cb.runs_first is not None), key=lambda cb: cb.runs_first or 0)
    last = [cb for cb in callbacks if isinstance(cb, Checkpoint) and cb not in first]
    return first + [cb for cb in callbacks if cb not in first and cb not in last] + last


def attach_model_callbacks(callbacks: list[Callback], module: Any) -> list[Callback]:
    """The Trainer's callbacks with those of ``module.configure_callbacks()`` merged in, as
    Lightning merges them when a call starts: a Trainer callback whose type the module's callback
    is (or derives from) is replaced, the module's are appended, and checkpoint callbacks go last."""
    given = module.configure_callbacks()
    if not given:
        return callbacks
    extra = [given] if isinstance(given, Callback) else list(given)
    for cb in extra:
        if not isinstance(cb, Callback):
            raise MisconfigurationError(
                f"{type(module).__name__}.configure_callbacks() returned a {type(cb).__name__}; return a "
                "fullshard Callback or a list of them."
            )
        if isinstance(cb, Checkpoint):
            check_directory(f"{type(cb).__name__}(dirpath=)", getattr(cb, "dirpath", None))
    trainer_types = {type(cb) for cb in callbacks} - {Callback}
    replaced = {t for t in trainer_types if any(issubclass(type(cb), t) for cb in extra)}
    if replaced:
        rank_zero_info(
            "The following callbacks returned in `configure_callbacks` will override existing callbacks "
            f"passed to Trainer: {', '.join(sorted(t.__name__ for t in replaced))}"
        )
    merged = [cb for cb in callbacks if type(cb) not in replaced] + extra
    return _lightning_order(merged)
