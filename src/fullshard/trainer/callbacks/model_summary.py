"""``ModelSummary`` and ``RichModelSummary``: the table of the model's layers at the start of fit."""

from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from fullshard.trainer.callbacks.base import Callback
from fullshard.trainer.callbacks.rich_support import require_rich
from fullshard.trainer.summary import model_summary

if TYPE_CHECKING:
    from fullshard.module import Module
    from fullshard.trainer.trainer import Trainer

log = logging.getLogger("fullshard.trainer.trainer")


class ModelSummary(Callback):
    """Logs a table of the model's layers, down to ``max_depth`` levels of submodules (``-1``:
    all of them, ``0``: no table), with parameter counts, when ``fit`` starts (global rank 0).
    Under FSDP the counts are of the whole model; the share a process holds is shown beside
    the total. Given in ``callbacks``, it replaces the Trainer's default summary.

    Raises:
        ValueError: for ``max_depth`` below -1.
    """

    def __init__(self, max_depth: int = 1, **summarize_kwargs: Any) -> None:
        if not isinstance(max_depth, int) or max_depth < -1:
            raise ValueError(
                f"ModelSummary(max_depth={max_depth!r}): give an int >= -1 (-1 shows every depth)."
            )
        self._max_depth = max_depth
        self._summarize_kwargs = summarize_kwargs

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: Module) -> None:
        if self._max_depth == 0 or not trainer.is_global_zero:
            return
        self.summarize(model_summary(pl_module, trainer.strategy.parameter_sizes(pl_module), self._max_depth))

    def summarize(self, table: str, **summarize_kwargs: Any) -> None:
        """Show the summary (logged at INFO, as the Trainer's own summary)."""
        log.info(table)


class RichModelSummary(ModelSummary):
    """:class:`ModelSummary` drawn with ``rich`` (``pip install 'fullshard[rich]'``).

    Raises:
        ModuleNotFoundError: when ``rich`` is not installed.
    """

    def __init__(self, max_depth: int = 1, **summarize_kwargs: Any) -> None:
        require_rich("RichModelSummary")
        super().__init__(max_depth, **summarize_kwargs)

    @override
    def summarize(self, table: str, **summarize_kwargs: Any) -> None:
        from rich.console import Console
        from rich.table import Table

        lines = table.splitlines()
        rule = next(i for i, line in enumerate(lines) if line.startswith("-"))
        end = next(i for i in range(rule + 1, len(lines)) if lines[i].startswith("-"))
        header = lines[0]
        starts = [header.index(word) for word in ("Name", "Type", "Params", "Mode")]
        rich_table = Table(header_style="bold magenta")
        for title in ("", "Name", "Type", "Params", "Mode"):
            rich_table.add_column(title)
        for line in lines[rule + 1 : end]:
            cuts = [0, *starts, len(line)]
            rich_table.add_row(*(line[a:b].strip() for a, b in itertools.pairwise(cuts)))
        console = Console(**self._summarize_kwargs)
        console.print(rich_table)
        console.print("\n".join(lines[end + 1 :]))
