"""``ModelSummary`` and ``RichModelSummary``: the table of the model's layers at the start of fit."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from fullshard.trainer.callbacks.base import Callback
from fullshard.trainer.callbacks.rich_support import require_rich
from fullshard.trainer.summary import SummaryData, format_summary, human_count, summary_data

if TYPE_CHECKING:
    from fullshard.module import Module
    from fullshard.trainer.trainer import Trainer

log = logging.getLogger("fullshard.trainer.trainer")


class ModelSummary(Callback):
    """Logs a table of the model's layers, down to ``max_depth`` levels of submodules (``-1``:
    all of them, ``0``: no table), with parameter counts, when ``fit`` starts (global rank 0).
    Under FSDP the counts are of the whole model; the share a process holds is shown beside
    the total. Given in ``callbacks``, it replaces the Trainer's default summary.

    The columns are Lightning's: name, type, parameters, mode, FLOPs, and, when the module has an
    ``example_input_array``, each layer's input and output sizes; the FLOPs and sizes come from
    one forward of that input in eval mode (not under the sharded strategies, where the FLOPs
    are 0 and the sizes left out). Override :meth:`summarize` (Lightning's signature, an
    instance or a static method) to show it differently; ``summarize_kwargs`` are passed on.

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
        self._data: SummaryData | None = None

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: Module) -> None:
        if self._max_depth == 0 or not trainer.is_global_zero:
            return
        # The FLOPs come from a forward of `example_input_array`, here on rank 0 alone: a sharded
        # module would wait for the other ranks' shards forever, so it is left out there.
        sharded = trainer.strategy.shards_parameters
        sizes = trainer.strategy.parameter_sizes(pl_module)
        data = summary_data(pl_module, sizes, self._max_depth, run_example=not sharded)
        self._data = data
        self.summarize(
            data.columns,
            data.total_parameters,
            data.trainable_parameters,
            data.model_size,
            data.total_training_modes,
            total_flops=data.total_flops,
            **self._summarize_kwargs,
        )

    def summarize(
        self,
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int = 0,
        **summarize_kwargs: Any,
    ) -> None:
        """Show the summary: ``summary_data`` is a list of (column header, values), one value per
        layer; the totals follow (``model_size`` in MB; ``total_flops``: one forward of
        ``example_input_array``, 0 without one). Logged at INFO."""
        data = self._data
        local = data.local_parameters if data is not None else total_parameters
        log.info(
            format_summary(
                SummaryData(
                    summary_data,
                    total_parameters,
                    trainable_parameters,
                    local,
                    model_size,
                    total_training_modes,
                    total_flops,
                )
            )
        )


class RichModelSummary(ModelSummary):
    """:class:`ModelSummary` drawn with ``rich`` (``pip install 'fullshard[rich]'``);
    ``summarize_kwargs`` are ``rich.table.Table``'s (``header_style="bold magenta"`` by default).

    Raises:
        ModuleNotFoundError: when ``rich`` is not installed.
    """

    def __init__(self, max_depth: int = 1, **summarize_kwargs: Any) -> None:
        require_rich("RichModelSummary")
        super().__init__(max_depth, **summarize_kwargs)

    @override
    def summarize(
        self,
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int = 0,
        **summarize_kwargs: Any,
    ) -> None:
        from rich import get_console
        from rich.table import Table

        table = Table(**{"header_style": "bold magenta", **summarize_kwargs})
        for header, _ in summary_data:
            table.add_column(header.strip())
        for row in zip(*(values for _, values in summary_data), strict=True):
            table.add_row(*row)
        console = get_console()
        console.print(table)
        console.print(f"Trainable params: {trainable_parameters}")
        console.print(f"Non-trainable params: {total_parameters - trainable_parameters}")
        console.print(f"Total params: {total_parameters}")
        console.print(f"Total estimated model params size (MB): {model_size:.3f}")
        console.print(f"Modules in train mode: {total_training_modes['train']}")
        console.print(f"Modules in eval mode: {total_training_modes['eval']}")
        console.print(f"Total FLOPs: {human_count(total_flops).strip()}")
