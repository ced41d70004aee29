"""``PyTorchProfiler``: ``torch.profiler`` over the whole call, each action a ``record_function``
range; a Chrome trace per rank in the log directory and an operator table."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.autograd.profiler import record_function

from fullshard.lightning_aliases import lightning_names
from fullshard.profilers.base import Profiler

_STEPS = ("training_step", "validation_step", "test_step", "predict_step")


class PyTorchProfiler(Profiler):
    """Profiles ``fit``/``validate``/``test``/``predict`` with ``torch.profiler.profile``.

    Each action (hook, step) is a named range in the trace, so the operators it ran sit under its
    name. At the end of the call every rank writes ``<stage>[-<filename>][-<rank>].pt.trace.json``
    (open it in ``chrome://tracing`` or Perfetto) to ``dirpath`` (default: the Trainer's
    ``log_dir``), and the table of ``key_averages()`` is printed on rank 0 and written as a
    ``.txt`` beside it when ``filename`` is set.

    Args:
        export_to_chrome: write the Chrome trace.
        row_limit: rows of the operator table (-1: all).
        sort_by_key: the table's sort column (default ``"cuda_time_total"`` with CUDA, else
            ``"cpu_time_total"``).
        **profiler_kwargs: passed to ``torch.profiler.profile`` (``record_shapes``,
            ``profile_memory``, ``with_stack``, ``activities``, ``schedule``: its steps are the
            ``*_step`` actions, ...).
    """

    def __init__(
        self,
        dirpath: str | Path | None = None,
        filename: str | None = None,
        export_to_chrome: bool = True,
        row_limit: int = 20,
        sort_by_key: str | None = None,
        **profiler_kwargs: Any,
    ) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        self.export_to_chrome = export_to_chrome
        self.row_limit = row_limit
        self.sort_by_key = sort_by_key or (
            "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
        )
        self.profiler_kwargs = profiler_kwargs
        self.profiler: torch.profiler.profile | None = None
        self._ranges: dict[str, list[record_function]] = {}
        self.trace_path: Path | None = None

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        super().setup(stage, local_rank, log_dir)
        kwargs = dict(self.profiler_kwargs)
        if "activities" not in kwargs:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            kwargs["activities"] = activities
        self.profiler = torch.profiler.profile(**kwargs)
        self.profiler.__enter__()

    def start(self, action_name: str) -> None:
        scope = record_function(action_name)
        scope.__enter__()
        self._ranges.setdefault(action_name, []).append(scope)

    def stop(self, action_name: str) -> None:
        scopes = self._ranges.get(action_name)
        if not scopes:
            raise ValueError(
                f"Attempting to stop recording an action ({action_name}) which was never started."
            )
        scopes.pop().__exit__(None, None, None)
        if self.profiler is not None and "schedule" in self.profiler_kwargs and action_name.endswith(_STEPS):
            self.profiler.step()  # a schedule (wait/warmup/active) counts steps

    def summary(self) -> str:
        profiler = self.profiler
        if profiler is None:
            return ""
        profiler.__exit__(None, None, None)
        self.profiler = None
        if self.export_to_chrome and self.dirpath:
            self.trace_path = Path(self.dirpath) / self.prepare_filename(extension=".pt.trace.json")
            self.trace_path.parent.mkdir(parents=True, exist_ok=True)
            profiler.export_chrome_trace(str(self.trace_path))
        table = profiler.key_averages().table(sort_by=self.sort_by_key, row_limit=self.row_limit)
        return self._stats_to_str({"records": table})

    def teardown(self, stage: str | None) -> None:
        if self.profiler is not None:  # the call failed before its report
            self.profiler.__exit__(None, None, None)
            self.profiler = None
        self._ranges = {}


if not TYPE_CHECKING:  # Lightning's names that live elsewhere: [Note: Lightning's module paths]
    __getattr__ = lightning_names(__name__)
