"""``SimpleProfiler``: the wall time of each action (mean, calls, total, share of the run)."""

from __future__ import annotations

import math
import os
import time
from collections import defaultdict
from pathlib import Path

from fullshard.profilers.base import Profiler


class SimpleProfiler(Profiler):
    """Times each action with ``time.perf_counter`` and reports, per action, the mean duration, the
    number of calls, the total and its share of the time since the profiler was made (Lightning's
    table, sorted by that share; ``extended=False``: mean and total only, sorted by the mean)."""

    def __init__(
        self, dirpath: str | Path | None = None, filename: str | None = None, extended: bool = True
    ) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        self.current_actions: dict[str, float] = {}
        self.recorded_durations: dict[str, list[float]] = defaultdict(list)
        self.extended = extended
        self.start_time = time.perf_counter()

    def start(self, action_name: str) -> None:
        if action_name in self.current_actions:
            raise ValueError(f"Attempted to start {action_name} which has already started.")
        self.current_actions[action_name] = time.perf_counter()

    def stop(self, action_name: str) -> None:
        end = time.perf_counter()
        if action_name not in self.current_actions:
            raise ValueError(
                f"Attempting to stop recording an action ({action_name}) which was never started."
            )
        self.recorded_durations[action_name].append(end - self.current_actions.pop(action_name))

    def summary(self) -> str:
        if not self.recorded_durations:
            return ""
        sep = os.linesep
        width = max(len(k) for k in self.recorded_durations)
        title = (f"{self._stage.upper()} " if self._stage is not None else "") + "Profiler Report" + sep
        if self.extended:
            total_time = time.perf_counter() - self.start_time
            rows = [
                (a, math.fsum(d) / len(d), len(d), math.fsum(d), 100.0 * math.fsum(d) / total_time)
                for a, d in self.recorded_durations.items()
            ]
            rows.sort(key=lambda r: r[4], reverse=True)

            def row(*cells: str) -> str:
                action, *rest = cells
                return f"{sep}|  {action:<{width}s}\t|" + "".join(f"  {c:<15}\t|" for c in rest)

            header = row("Action", "Mean duration (s)", "Num calls", "Total time (s)", "Percentage %")
            line = sep + "-" * len(header.expandtabs())
            out = title + line + header + line
            out += row("Total", "-", str(sum(r[2] for r in rows)), f"{total_time:.5}", "100 %") + line
            for action, mean, calls, total, share in rows:
                out += row(action, f"{mean:.5}", str(calls), f"{total:.5}", f"{share:.5}")
            return out + line + sep
        plain = [(a, math.fsum(d) / len(d), math.fsum(d)) for a, d in self.recorded_durations.items()]
        plain.sort(key=lambda r: r[1], reverse=True)
        header = f"{sep}|  {'Action':<{width}s}\t|  {'Mean duration (s)':<15}\t|  {'Total time (s)':<15}\t|"
        line = sep + "-" * len(header.expandtabs())
        out = title + line + header + line
        for action, mean, total in plain:
            out += f"{sep}|  {action:<{width}s}\t|  {mean:<15.5}\t|  {total:<15.5}\t|"
        return out + line + sep
