"""``AdvancedProfiler``: a ``cProfile`` profile of each action, reported with ``pstats``."""

from __future__ import annotations

import cProfile
import io
import pstats
from pathlib import Path

from fullshard.profilers.base import Profiler


class AdvancedProfiler(Profiler):
    """Runs ``cProfile`` around each action and reports, per action, the functions it spent its
    time in (sorted by cumulative time, as Lightning's; ``line_count_restriction`` limits the
    lines: a fraction or a count, as ``pstats.Stats.print_stats`` takes it).

    Only one ``cProfile`` can be active at a time, so a nested action (a hook inside
    ``run_training_epoch``) pauses the enclosing one: each action's report covers the time it
    ran outside the actions it encloses."""

    def __init__(
        self,
        dirpath: str | Path | None = None,
        filename: str | None = None,
        line_count_restriction: float = 1.0,
    ) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        self.profiled_actions: dict[str, cProfile.Profile] = {}
        self.line_count_restriction = line_count_restriction
        self._active: list[cProfile.Profile] = []  # the actions running, innermost last

    def start(self, action_name: str) -> None:
        profiler = self.profiled_actions.get(action_name)
        if profiler is None:
            profiler = self.profiled_actions[action_name] = cProfile.Profile()
        if self._active:
            self._active[-1].disable()
        self._active.append(profiler)
        profiler.enable()

    def stop(self, action_name: str) -> None:
        profiler = self.profiled_actions.get(action_name)
        if profiler is None or profiler not in self._active:
            raise ValueError(
                f"Attempting to stop recording an action ({action_name}) which was never started."
            )
        profiler.disable()
        self._active.remove(profiler)
        if self._active:
            self._active[-1].enable()

    def summary(self) -> str:
        stats = {}
        for action, profiler in self.profiled_actions.items():
            stream = io.StringIO()
            pstats.Stats(profiler, stream=stream).strip_dirs().sort_stats("cumulative").print_stats(
                self.line_count_restriction
            )
            stats[action] = stream.getvalue()
        return self._stats_to_str(stats) if stats else ""

    def teardown(self, stage: str | None) -> None:
        self.profiled_actions = {}
