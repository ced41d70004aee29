"""The progress bars: ``ProgressBar``, the base every bar derives from (Lightning's: what the
Trainer finds as ``trainer.progress_bar_callback``, the metrics a bar shows, the batch totals),
and ``TQDMProgressBar``, the tqdm bar, shown on global rank 0 only.

Cost of the tqdm bar on the training path: one integer increment and one ``tqdm.update`` call per
batch (and fewer with ``refresh_rate > 1``); tqdm itself redraws at most every ``mininterval``
seconds. The postfix (:meth:`ProgressBar.get_metrics`) is formatted only when tqdm actually
redraws the bar, never per batch; see ``_Bar``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from tqdm import tqdm
from typing_extensions import override

from fullshard.rank_zero import rank_zero_warn
from fullshard.trainer.callbacks.base import Callback

if TYPE_CHECKING:
    from fullshard.module import Module
    from fullshard.trainer.trainer import Trainer

__all__ = ["ProgressBar", "TQDMProgressBar", "get_standard_metrics"]


def get_standard_metrics(trainer: Trainer) -> dict[str, int | str]:
    """What every bar shows besides the ``prog_bar`` metrics: ``v_num``, the loggers' version (the
    version of the only logger, or the distinct versions of several joined by ``_``; a string
    version shows its last 4 characters), when there is one."""
    loggers = list(getattr(trainer, "loggers", None) or [])
    if not loggers:
        return {}
    if len(loggers) == 1:
        version = loggers[0].version
    else:
        version = "_".join(dict.fromkeys(str(lg.version) for lg in loggers))
    if version in ("", None):
        return {}
    return {"v_num": version[-4:] if isinstance(version, str) else version}


def _train_batches(trainer: Trainer) -> int | float:
    """Batches in the current training epoch; with ``max_epochs=-1`` and ``max_steps`` no more
    than the steps left."""
    max_steps = getattr(trainer, "max_steps", -1)
    if getattr(trainer, "max_epochs", None) == -1 and max_steps is not None and max_steps > 0:
        return min(trainer.num_training_batches, max_steps - trainer.global_step)
    return trainer.num_training_batches


def _finite_total(count: float) -> int | None:
    """A batch count as tqdm's ``total``: ``None`` when unknown (infinite)."""
    return int(count) if math.isfinite(count) else None


class ProgressBar(Callback):
    """The base of the progress bars (Lightning's ``ProgressBar``): subclass it for a bar of your
    own, implementing :meth:`disable` and :meth:`enable`; the Trainer then adds no default bar.

    It keeps the Trainer (:attr:`trainer`, set in ``setup``), disables itself on ranks other than
    global rank 0, and gives the numbers a bar draws: the batch totals and :meth:`get_metrics`.
    """

    def __init__(self) -> None:
        self._trainer: Trainer | None = None
        self._current_eval_dataloader_idx: int | None = None

    @property
    def trainer(self) -> Trainer:
        """The Trainer the bar runs in (set when a run starts)."""
        if self._trainer is None:
            raise TypeError(
                f"`{type(self).__name__}.trainer` is not set yet: it is set when the Trainer's run starts "
                "(the callback's `setup`)."
            )
        return self._trainer

    @property
    def sanity_check_description(self) -> str:
        return "Sanity Checking"

    @property
    def train_description(self) -> str:
        return "Training"

    @property
    def validation_description(self) -> str:
        return "Validation"

    @property
    def test_description(self) -> str:
        return "Testing"

    @property
    def predict_description(self) -> str:
        return "Predicting"

    @property
    def total_train_batches(self) -> int | float:
        """Batches in the current training epoch (``inf`` for an endless loader); with
        ``max_epochs=-1`` and ``max_steps`` no more than the steps left."""
        return _train_batches(self.trainer)

    @property
    def total_val_batches_current_dataloader(self) -> int | float:
        """Batches of the validation loader being run (the sanity check's count during it)."""
        trainer = self.trainer
        batches = trainer.num_sanity_val_batches if trainer.sanity_checking else trainer.num_val_batches
        return batches[self._current_eval_dataloader_idx or 0]

    @property
    def total_test_batches_current_dataloader(self) -> int | float:
        """Batches of the test loader being run."""
        return self.trainer.num_test_batches[self._current_eval_dataloader_idx or 0]

    @property
    def total_predict_batches_current_dataloader(self) -> int | float:
        """Batches of the predict loader being run."""
        return self.trainer.num_predict_batches[self._current_eval_dataloader_idx or 0]

    def has_dataloader_changed(self, dataloader_idx: int) -> bool:
        """Record ``dataloader_idx`` as the current loader; whether it differs from the last one."""
        old, self._current_eval_dataloader_idx = self._current_eval_dataloader_idx, dataloader_idx
        return old != dataloader_idx

    def reset_dataloader_idx_tracker(self) -> None:
        self._current_eval_dataloader_idx = None

    @property
    def is_enabled(self) -> bool:
        """Whether the bar draws. A subclass says; the base always does."""
        return True

    @property
    def is_disabled(self) -> bool:
        """``not is_enabled``."""
        return not self.is_enabled

    def disable(self) -> None:
        """Stop drawing. A subclass must implement it (the Trainer disables the bar off rank 0)."""
        raise NotImplementedError(f"{type(self).__name__} must implement `disable()` (and `enable()`).")

    def enable(self) -> None:
        """Draw again after :meth:`disable`. A subclass must implement it."""
        raise NotImplementedError(f"{type(self).__name__} must implement `enable()` (and `disable()`).")

    def print(self, *args: Any, **kwargs: Any) -> None:
        """Print without breaking the bar (the base prints plainly)."""
        print(*args, **kwargs)

    @override
    def setup(self, trainer: Trainer, pl_module: Module, stage: str) -> None:
        self._trainer = trainer
        if not trainer.is_global_zero:
            self.disable()

    def get_metrics(self, trainer: Trainer, pl_module: Module | None) -> dict[str, Any]:
        """What the bar shows after the count: ``v_num`` (:func:`get_standard_metrics`) and the
        metrics logged with ``prog_bar=True``, which win over ``v_num`` (with a warning). Override
        it to change what is shown."""
        standard = get_standard_metrics(trainer)
        shown = trainer.progress_bar_metrics
        duplicates = sorted(standard.keys() & shown.keys())
        if duplicates:
            rank_zero_warn(
                f"The progress bar already shows '{', '.join(duplicates)}': the value logged with "
                f"`self.log('{duplicates[0]}', ..., prog_bar=True)` replaces it. Log it under another name, "
                "or override `get_metrics()` of the progress bar callback."
            )
        return {**standard, **shown}


class _Bar(tqdm):  # type: ignore[misc]  # tqdm ships no type information
    """A tqdm bar whose postfix comes from a callable, evaluated only when the bar is drawn.

    ``set_postfix`` formats its text eagerly, which would cost a string format per batch even
    though tqdm draws a few times a second at most. tqdm reads everything it draws from
    ``format_dict``, so the postfix is produced there instead.
    """

    def __init__(self, postfix_fn: Callable[[], str] | None = None, **kwargs: Any) -> None:
        # Set before tqdm's __init__, which may draw the bar right away.
        self._postfix_fn = postfix_fn
        super().__init__(**kwargs)

    @property
    def format_dict(self) -> dict[str, Any]:
        values: dict[str, Any] = super().format_dict
        if self._postfix_fn is not None:
            values["postfix"] = self._postfix_fn()
        return values


def _format_value(value: Any) -> str:
    """A metric as the bar shows it: a float with 3 significant digits, padded with zeros to 5
    characters so the bar does not flicker as digits come and go (Lightning's format)."""
    if hasattr(value, "item") and getattr(value, "numel", lambda: 0)() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    text = tqdm.format_num(value)
    if isinstance(value, float) and "e" not in text:
        if "." not in text and len(text) < 5:
            text += "."
        text = text.ljust(5, "0")
    return str(text)


class TQDMProgressBar(ProgressBar):
    """The default bar without ``rich``: a training bar (``Epoch <n>``, the epoch's batch count,
    then :meth:`get_metrics`: ``v_num`` and the ``prog_bar`` metrics), a transient bar below it
    for each validation run, and a bar for ``validate``, ``test`` and ``predict`` (``Testing
    DataLoader <i>``, started again for each dataloader), drawn with tqdm on standard output by
    global rank 0.

    Args:
        refresh_rate: Advance the bars every this many batches; 0 hides the bar.
        process_position: Draw this many bar pairs lower (2 lines each), to sit under bars of
            another process.
        leave: Keep each epoch's finished training bar on screen (False: one bar is reused by the
            epochs and stays when training ends).
        mininterval: Minimum seconds between two redraws (tqdm's ``mininterval``); fullshard's.
        file: Stream to draw on; standard output when ``None``; fullshard's.

    Raises:
        ValueError: for a negative ``refresh_rate`` or ``process_position``, or a negative
            ``mininterval``.
    """

    def __init__(
        self,
        refresh_rate: int = 1,
        process_position: int = 0,
        leave: bool = False,
        *,
        mininterval: float = 0.2,
        file: TextIO | None = None,
    ) -> None:
        super().__init__()
        for arg, value in (("refresh_rate", refresh_rate), ("process_position", process_position)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(
                    f"TQDMProgressBar({arg}={value!r}): give an int >= 0 (`refresh_rate=0` hides the bar)."
                )
        if mininterval < 0:
            raise ValueError(f"`mininterval` must be >= 0 seconds, got {mininterval!r}.")
        self._refresh_rate = refresh_rate
        self._process_position = process_position
        self._leave = leave
        self.mininterval = mininterval
        self.file = file
        self._enabled = True
        self._train_bar: _Bar | None = None
        self._eval_bar: _Bar | None = None
        self._train_pending = 0  # batches done but not yet passed to the bar
        self._eval_pending = 0

    def __getstate__(self) -> dict[str, Any]:
        # open bars hold the stream they draw on; a pickled callback (spawn, deepcopy) leaves them
        return {k: None if isinstance(v, tqdm) else v for k, v in vars(self).items()}

    @property
    def refresh_rate(self) -> int:
        return self._refresh_rate

    @property
    def process_position(self) -> int:
        return self._process_position

    @property
    def leave(self) -> bool:
        return self._leave

    @property
    @override
    def is_enabled(self) -> bool:
        """Whether bars are drawn (on global rank 0): not disabled, and ``refresh_rate > 0``."""
        return self._enabled and self._refresh_rate > 0

    @override
    def disable(self) -> None:
        """Stop drawing, closing any open bar."""
        self._enabled = False
        self._close_all()

    @override
    def enable(self) -> None:
        """Draw bars again after :meth:`disable` (a bar made with ``refresh_rate=0`` stays hidden)."""
        self._enabled = True

    @override
    def print(self, *args: Any, sep: str = " ", **kwargs: Any) -> None:
        bar = self._train_bar or self._eval_bar  # the open bar that leaves room for the text
        if bar is None:
            print(*args, sep=sep, **kwargs)
        else:
            bar.write(sep.join(map(str, args)), file=self.file or sys.stdout)

    def _draws(self, trainer: Trainer) -> bool:
        return self.is_enabled and bool(trainer.is_global_zero)

    def _new_bar(self, trainer: Trainer | None, **kwargs: Any) -> _Bar:
        postfix = None if trainer is None else (lambda: self._postfix(trainer))
        return _Bar(
            postfix_fn=postfix,
            mininterval=self.mininterval,
            file=self.file or sys.stdout,
            dynamic_ncols=True,
            **kwargs,
        )

    # ----- training -----

    @override
    def on_train_epoch_start(self, trainer: Trainer, module: Module) -> None:
        if self._leave:
            self._close_train_bar()
        if not self._draws(trainer):
            return
        self._train_pending = 0
        total = _finite_total(_train_batches(trainer))
        start = getattr(trainer, "batch_idx_start", 0)
        if self._train_bar is None:
            self._train_bar = self._new_bar(
                trainer,
                total=total,
                initial=start,
                desc=f"Epoch {trainer.current_epoch}",
                leave=True,
                position=2 * self._process_position,
            )
            return
        bar = self._train_bar  # the reused bar (leave=False): back to the start of the new epoch
        bar.set_description(f"Epoch {trainer.current_epoch}", refresh=False)
        bar.reset(total=total)
        if start:
            bar.n = start
            bar.refresh()

    @override
    def on_train_batch_end(
        self, trainer: Trainer, module: Module, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        bar = self._train_bar
        if bar is None:
            return
        self._train_pending += 1
        if self._train_pending >= self._refresh_rate:
            bar.update(self._train_pending)
            self._train_pending = 0

    @override
    def on_train_epoch_end(self, trainer: Trainer, module: Module) -> None:
        bar = self._train_bar
        if bar is None:
            return
        if self._train_pending:
            bar.update(self._train_pending)
            self._train_pending = 0
        if self._leave:
            self._close_train_bar()
        else:
            bar.refresh()

    @override
    def on_train_end(self, trainer: Trainer, module: Module) -> None:
        self._close_all()

    # ----- validation, test, predict: one bar, reset for each dataloader -----

    @override
    def on_validation_start(self, trainer: Trainer, module: Module) -> None:
        below_train_bar = self._train_bar is not None
        # a standalone `validate` keeps its finished bar, as the training bar is kept
        self._open_eval_bar(
            trainer, leave=not (below_train_bar or trainer.sanity_checking), lower=below_train_bar
        )

    @override
    def on_validation_batch_start(
        self, trainer: Trainer, pl_module: Module, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        desc = self.sanity_check_description if trainer.sanity_checking else self.validation_description
        batches = trainer.num_sanity_val_batches if trainer.sanity_checking else trainer.num_val_batches
        self._next_loader(desc, batches, dataloader_idx)

    @override
    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: Module,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._advance_eval_bar()

    @override
    def on_validation_end(self, trainer: Trainer, module: Module) -> None:
        self._close_eval_bar()
        if self._train_bar is not None:
            # Validation metrics just joined `progress_bar_metrics`; show them without waiting
            # for the next training batch.
            self._train_bar.refresh()

    @override
    def on_test_start(self, trainer: Trainer, module: Module) -> None:
        self._open_eval_bar(trainer, leave=True, lower=False)

    @override
    def on_test_batch_start(
        self, trainer: Trainer, pl_module: Module, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._next_loader(self.test_description, trainer.num_test_batches, dataloader_idx)

    @override
    def on_test_batch_end(
        self,
        trainer: Trainer,
        pl_module: Module,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._advance_eval_bar()

    @override
    def on_test_end(self, trainer: Trainer, module: Module) -> None:
        self._close_eval_bar()

    @override
    def on_predict_start(self, trainer: Trainer, module: Module) -> None:
        self._open_eval_bar(trainer, leave=True, lower=False)

    @override
    def on_predict_batch_start(
        self, trainer: Trainer, pl_module: Module, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._next_loader(self.predict_description, trainer.num_predict_batches, dataloader_idx)

    @override
    def on_predict_batch_end(
        self,
        trainer: Trainer,
        pl_module: Module,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._advance_eval_bar()

    @override
    def on_predict_end(self, trainer: Trainer, module: Module) -> None:
        self._close_eval_bar()

    def _open_eval_bar(self, trainer: Trainer, leave: bool, lower: bool) -> None:
        """A bar for an evaluation run, below the training bar when ``lower``; it gets its
        description and total when the first dataloader starts."""
        self._close_eval_bar()
        if not self._draws(trainer):
            return
        self._eval_pending = 0
        self._eval_bar = self._new_bar(
            None, total=None, leave=leave, position=2 * self._process_position + lower
        )

    def _next_loader(self, desc: str, batches: list[int | float], dataloader_idx: int) -> None:
        """At each new dataloader, the bar starts again: ``<desc> DataLoader <i>``, that loader's count."""
        bar = self._eval_bar
        if bar is None or not self.has_dataloader_changed(dataloader_idx):
            return
        self._eval_pending = 0
        bar.set_description(f"{desc} DataLoader {dataloader_idx}", refresh=False)
        bar.reset(total=_finite_total(batches[dataloader_idx]))

    def _advance_eval_bar(self) -> None:
        bar = self._eval_bar
        if bar is None:
            return
        self._eval_pending += 1
        if self._eval_pending >= self._refresh_rate:
            bar.update(self._eval_pending)
            self._eval_pending = 0

    # ----- shutdown -----

    @override
    def teardown(self, trainer: Trainer, module: Module, stage: str) -> None:
        self._close_all()

    @override
    def on_exception(self, trainer: Trainer, module: Module, exception: BaseException) -> None:
        self._close_all()

    def _postfix(self, trainer: Trainer) -> str:
        metrics = self.get_metrics(trainer, getattr(trainer, "lightning_module", None))
        return ", ".join(f"{key}={_format_value(value)}" for key, value in metrics.items())

    def _close_train_bar(self) -> None:
        bar = self._train_bar
        if bar is None:
            return
        if self._train_pending:
            bar.update(self._train_pending)
            self._train_pending = 0
        bar.refresh()  # the final count where the bar stands (update() may have skipped the draw)
        bar.close()
        self._train_bar = None

    def _close_eval_bar(self) -> None:
        self.reset_dataloader_idx_tracker()
        bar = self._eval_bar
        if bar is None:
            return
        if self._eval_pending:
            bar.update(self._eval_pending)
            self._eval_pending = 0
        bar.refresh()  # the final count where the bar stands (update() may have skipped the draw)
        bar.close()
        self._eval_bar = None

    def _close_all(self) -> None:
        self._close_eval_bar()
        self._close_train_bar()
