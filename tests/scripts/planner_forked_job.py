"""The planner's forked simulation workers, in a fresh single-threaded process (a process running
other threads plans without forking: [Note: simulating on several cores] in
fullshard/planner/forked.py). Run by tests/test_planner.py::test_simulations_on_several_cores_give_the_plan_of_one.

    python tests/scripts/planner_forked_job.py
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parents[1]))
from fullshard.planner import plan
from test_planner import Net, batch

assert threading.active_count() == 1, threading.enumerate()
forks = 0
real_fork = os.fork


def counting_fork() -> int:
    global forks
    pid = real_fork()
    if pid:
        forks += 1
    return pid


os.fork = counting_fork
kwargs: dict[str, Any] = dict(devices=2, device_memory="4MiB", device_type="cpu", engines=("fsdp2",))
inline = plan(Net(depth=4), batch(), workers=1, **kwargs)
assert forks == 0, forks
forked = plan(Net(depth=4), batch(), workers=3, **kwargs)
assert forks == 3, f"3 workers should fork 3 children, forked {forks}"
assert [(r.candidate, r.peak, r.split, r.flops) for r in forked.rows] == [
    (r.candidate, r.peak, r.split, r.flops) for r in inline.rows
]


class Broken(Net):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        raise ValueError("broken step 42")


try:
    plan(Broken(depth=4), batch(), devices=2, device_memory="4MiB", device_type="cpu", workers=2)
except ValueError as error:
    assert "broken step 42" in str(error), error
else:
    raise AssertionError("a failing simulation in a worker raised nothing")
print("forked planning ok")
