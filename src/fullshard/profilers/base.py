"""The ``Profiler`` base class and the no-op profiler, with Lightning's interface.

A profiler records named *actions* (``start(name)``/``stop(name)``, or ``profile(name)`` as a
context manager). The Trainer does not ask ``if profiler:`` in its loops: when a call starts it
wraps the callables it will run (hooks, the strategy's steps; see ``fullshard/profilers/attach.py``)
with :meth:`Profiler.wrap`, once, and puts them back when the call ends. With no profiler nothing
is wrapped, so an unprofiled run pays nothing per step.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from collections.abc import Callable, Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

log = logging.getLogger("fullshard")


class Profiler:
    """Base class: subclasses implement :meth:`start`, :meth:`stop` and :meth:`summary`.

    Args:
        dirpath: where the report file goes; None: the Trainer's ``log_dir``.
        filename: the report's file name (``<stage>-<filename>[-<rank>].txt``, as Lightning names
            it); None: the report is only printed (on global rank 0).
    """

    def __init__(self, dirpath: str | Path | None = None, filename: str | None = None) -> None:
        self.dirpath = dirpath
        self.filename = filename
        self._stage: str | None = None
        self._local_rank: int | None = None

    # ------------------------------------------------------------------------ recording
    def start(self, action_name: str) -> None:
        """Start recording ``action_name``."""
        raise NotImplementedError

    def stop(self, action_name: str) -> None:
        """Stop recording ``action_name``."""
        raise NotImplementedError

    def summary(self) -> str:
        """The report of what was recorded."""
        return ""

    @contextmanager
    def profile(self, action_name: str) -> Generator[str, None, None]:
        """Record the enclosed block as ``action_name``: ``with trainer.profiler.profile("x"): ...``."""
        try:
            self.start(action_name)
            yield action_name
        finally:
            self.stop(action_name)

    def wrap(self, action_name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        """``function``, recorded as ``action_name`` at each call."""
        start, stop = self.start, self.stop

        @functools.wraps(function)
        def profiled(*args: Any, **kwargs: Any) -> Any:
            start(action_name)
            try:
                return function(*args, **kwargs)
            finally:
                stop(action_name)

        return profiled

    # ---------------------------------------------------------------------- life cycle
    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        """Called when ``fit``/``validate``/``test``/``predict`` starts (``local_rank`` None with
        one process)."""
        self._stage = stage
        self._local_rank = local_rank
        self.dirpath = self.dirpath or log_dir

    def teardown(self, stage: str | None) -> None:
        """Called after the report was written."""

    def describe(self, print_report: bool = True) -> None:
        """Write the report to the file (when ``filename`` is set) and print it (``print_report``)."""
        report = self.summary()
        if not report:
            self.teardown(self._stage)
            return
        path = self.report_path()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as file:
                _write(file, report)
        if print_report:
            log.info(report)
        self.teardown(self._stage)

    def report_path(self, action_name: str | None = None, extension: str = ".txt") -> Path | None:
        """Where :meth:`describe` writes (None without ``filename`` or directory)."""
        if not self.filename or not self.dirpath:
            return None
        return Path(self.dirpath) / self.prepare_filename(action_name, extension)

    def prepare_filename(self, action_name: str | None = None, extension: str = ".txt") -> str:
        """``<stage>-<filename>-<local rank>-<action>`` (the parts that are set) + ``extension``,
        as Lightning names its profiler files."""
        parts = [p for p in (self._stage, self.filename) if p]
        if self._local_rank is not None:
            parts.append(str(self._local_rank))
        if action_name is not None:
            parts.append(action_name)
        base = re.sub(r"_+", "_", re.sub(r"[\\/:*?\"<>|\n\r\t]", "_", "-".join(parts))).strip()
        return (base or "profile") + extension

    @property
    def local_rank(self) -> int:
        return 0 if self._local_rank is None else self._local_rank

    def _stats_to_str(self, stats: dict[str, str]) -> str:
        stage = f"{self._stage.upper()} " if self._stage is not None else ""
        lines = [stage + "Profiler Report"]
        for action, value in stats.items():
            header = f"Profile stats for: {action}"
            if self._local_rank is not None:
                header += f" rank: {self._local_rank}"
            lines += [header, value]
        return os.linesep.join(lines)


class PassThroughProfiler(Profiler):
    """The profiler of ``Trainer(profiler=None)``: records nothing, and the Trainer wraps nothing
    with it. ``trainer.profiler.profile("x")`` in user code still works (and costs a call)."""

    def start(self, action_name: str) -> None:
        pass

    def stop(self, action_name: str) -> None:
        pass

    def wrap(self, action_name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        return function


def _write(file: TextIO, text: str) -> None:
    file.write(text)
    if not text.endswith("\n"):
        file.write("\n")
