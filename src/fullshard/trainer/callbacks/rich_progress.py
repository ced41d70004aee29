"""``RichProgressBar``: the progress bar drawn with ``rich`` (an optional extra:
``pip install 'fullshard[rich]'``), on global rank 0 only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from fullshard.trainer.callbacks.progress_bar import ProgressBar
from fullshard.trainer.callbacks.rich_support import require_rich

if TYPE_CHECKING:
    from fullshard.module import Module
    from fullshard.trainer.trainer import Trainer


@dataclass
class RichProgressBarTheme:
    """Styles of the bar's parts (``rich`` style strings), Lightning's fields and defaults."""

    description: str = ""
    progress_bar: str = "#6206E0"
    progress_bar_finished: str = "#6206E0"
    progress_bar_pulse: str = "#6206E0"
    batch_progress: str = ""
    time: str = "dim"
    processing_speed: str = "dim underline"
    metrics: str = "italic"
    metrics_text_delimiter: str = " "
    metrics_format: str = ".3f"


class RichProgressBar(ProgressBar):
    """A training bar per epoch and a bar per validation run, drawn by ``rich``, with the global
    step and the ``prog_bar`` metrics after the training bar.

    Args:
        refresh_rate: advance the bars every this many batches (0 disables the bar).
        leave: keep each epoch's finished bar on screen.
        theme: the styles (:class:`RichProgressBarTheme`).
        console_kwargs: arguments of the ``rich.console.Console`` it draws on.

    Raises:
        ModuleNotFoundError: when ``rich`` is not installed (the message names the extra).
        ValueError: for a negative ``refresh_rate``.
    """

    def __init__(
        self,
        refresh_rate: int = 1,
        leave: bool = False,
        theme: RichProgressBarTheme | None = None,
        console_kwargs: dict[str, Any] | None = None,
    ) -> None:
        require_rich("RichProgressBar")
        if refresh_rate < 0:
            raise ValueError(
                f"RichProgressBar(refresh_rate={refresh_rate!r}): give an int >= 0 (0 disables it)."
            )
        super().__init__()
        self._refresh_rate = refresh_rate
        self._enabled = True
        self.leave = leave
        self.theme = theme or RichProgressBarTheme()
        self._console_kwargs = console_kwargs or {}
        self._progress: Any = None
        self._train_task: Any = None
        self._val_task: Any = None
        self._rich_pending = 0

    @property
    def refresh_rate(self) -> int:
        return self._refresh_rate

    @property
    @override
    def is_enabled(self) -> bool:
        """Whether the bar draws (on global rank 0): not disabled, and ``refresh_rate > 0``."""
        return self._enabled and self._refresh_rate > 0

    @override
    def enable(self) -> None:
        """Draw again after :meth:`disable` (a bar made with ``refresh_rate=0`` stays hidden)."""
        self._enabled = True

    @property
    def progress(self) -> Any:
        """The ``rich.progress.Progress`` being drawn (None when none is)."""
        return self._progress

    def _start(self) -> Any:
        if self._progress is None:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("[progress.description]{task.description}", style=self.theme.description),
                BarColumn(
                    complete_style=self.theme.progress_bar,
                    finished_style=self.theme.progress_bar_finished,
                    pulse_style=self.theme.progress_bar_pulse,
                ),
                TextColumn("{task.completed}/{task.total}", style=self.theme.batch_progress),
                TimeElapsedColumn(),
                TextColumn("{task.fields[metrics]}", style=self.theme.metrics),
                console=Console(**self._console_kwargs),
                transient=not self.leave,
                auto_refresh=False,
            )
            self._progress.start()
        return self._progress

    def _metrics(self, trainer: Trainer) -> str:
        parts = []
        for key, value in self.get_metrics(trainer, getattr(trainer, "lightning_module", None)).items():
            if hasattr(value, "item") and getattr(value, "numel", lambda: 0)() == 1:
                value = value.item()
            shown = format(value, self.theme.metrics_format) if isinstance(value, float) else value
            parts.append(f"{key}: {shown}")
        return self.theme.metrics_text_delimiter.join(parts)

    @override
    def on_train_epoch_start(self, trainer: Trainer, module: Module) -> None:
        if not (self.is_enabled and trainer.is_global_zero):
            return
        progress = self._start()
        if self._train_task is not None:  # the previous epoch's bar: kept on screen or removed
            if self.leave:
                progress.stop_task(self._train_task)
            else:
                progress.remove_task(self._train_task)
        total = trainer.num_training_batches
        self._train_task = progress.add_task(
            f"Epoch {trainer.current_epoch}",
            total=None if total == float("inf") else int(total),
            completed=trainer.batch_idx_start,
            metrics=self._metrics(trainer),
        )
        progress.refresh()

    @override
    def on_train_batch_end(
        self, trainer: Trainer, module: Module, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._progress is None or self._train_task is None:
            return
        self._rich_pending += 1
        if self._rich_pending >= self.refresh_rate or trainer.is_last_batch:
            self._progress.update(
                self._train_task, advance=self._rich_pending, metrics=self._metrics(trainer)
            )
            self._rich_pending = 0
            self._progress.refresh()

    @override
    def on_train_epoch_end(self, trainer: Trainer, module: Module) -> None:
        if self._progress is not None and self._train_task is not None:
            self._progress.update(
                self._train_task, advance=self._rich_pending, metrics=self._metrics(trainer)
            )
            self._rich_pending = 0
            self._progress.refresh()

    @override
    def on_train_end(self, trainer: Trainer, module: Module) -> None:
        self._stop()

    @override
    def on_validation_start(self, trainer: Trainer, module: Module) -> None:
        if not (self.is_enabled and trainer.is_global_zero):
            return
        progress = self._start()
        batches = sum(trainer.num_sanity_val_batches if trainer.sanity_checking else trainer.num_val_batches)
        self._val_task = progress.add_task(
            "Sanity Checking" if trainer.sanity_checking else "Validation",
            total=None if batches == float("inf") else int(batches),
            metrics="",
        )

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
        if self._progress is not None and self._val_task is not None:
            self._progress.update(self._val_task, advance=1)
            if (batch_idx + 1) % max(self.refresh_rate, 1) == 0:
                self._progress.refresh()

    @override
    def on_validation_end(self, trainer: Trainer, module: Module) -> None:
        if self._progress is not None and self._val_task is not None:
            self._progress.remove_task(self._val_task)
            self._val_task = None
            if self._train_task is not None:
                self._progress.update(self._train_task, metrics=self._metrics(trainer))
            self._progress.refresh()

    @override
    def teardown(self, trainer: Trainer, module: Module, stage: str) -> None:
        self._stop()

    @override
    def on_exception(self, trainer: Trainer, module: Module, exception: BaseException) -> None:
        self._stop()

    @override
    def disable(self) -> None:
        """Stop drawing, closing the bars on screen."""
        self._enabled = False
        self._stop()

    def _stop(self) -> None:
        if self._progress is not None:
            self._progress.refresh()
            self._progress.stop()
        self._progress = self._train_task = self._val_task = None
        self._rich_pending = 0
