"""The planner's forked workers take their jobs from one queue (fullshard/planner/forked.py,
[Note: simulating on several cores]): a slow job that waits for every other job to finish
finishes only if another worker runs all of them (with fixed shares it would wait for jobs dealt
to its own worker, after it). Run by tests/test_planner_cost.py.

    python tests/scripts/planner_queue_job.py
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "src"))
from fullshard.planner.forked import run_forked

assert threading.active_count() == 1, threading.enumerate()
FAST = 7
folder = Path(tempfile.mkdtemp())


def slow() -> tuple[str, int]:
    deadline = time.monotonic() + 120
    while len(list(folder.iterdir())) < FAST:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the other jobs did not finish: {sorted(p.name for p in folder.iterdir())}")
        time.sleep(0.01)
    return "slow", os.getpid()


def fast(index: int) -> tuple[str, int]:
    (folder / str(index)).touch()
    return f"fast {index}", os.getpid()


jobs = [slow, *[lambda i=i: fast(i) for i in range(FAST)]]
results = run_forked(jobs, 2)
assert [name for name, _ in results] == ["slow", *[f"fast {i}" for i in range(FAST)]], results
pids = {pid for _, pid in results}
assert len(pids) == 2 and os.getpid() not in pids, (pids, os.getpid())
slow_pid = results[0][1]
assert all(pid != slow_pid for _, pid in results[1:]), results  # the other worker ran every fast job


def broken() -> None:
    raise ValueError("broken job 7")


try:
    run_forked([lambda: 1, broken, lambda: 3], 2)
except ValueError as error:
    assert "broken job 7" in str(error), error
else:
    raise AssertionError("a failing job in a worker raised nothing")
print("queued jobs ok")
