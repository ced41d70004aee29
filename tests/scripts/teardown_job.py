"""A two-process gloo job whose rank 1 ends while a gloo worker thread still has to release a
finished collective; tests/test_teardown.py runs it several times and expects exit code 0.

Run it as:

    python tests/scripts/teardown_job.py

Rank 1 (the copy SubprocessScriptLauncher starts) makes what a loaded machine makes rarely
certain: after an all_reduce on a Python tensor completes, the worker that ran it must take the
GIL to drop it, and rank 1 holds the GIL, with a switch interval that never hands it over, until
its program ends (see [Note: a launched copy leaves with os._exit] in fullshard.launch.rerun_main).
A copy that finalized its interpreter would then abort with "terminate called without an active
exception" most of the time. The process group is kept alive to the end, as the modules DDP and
FSDP wrap keep it.
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from fullshard.launch import LocalEnvironment, SubprocessScriptLauncher


def join(env: LocalEnvironment) -> int:
    rank = env.local_rank()
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{env.main_address}:{env.main_port}",
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=60),
    )
    return rank


def main() -> None:
    env = LocalEnvironment()
    rank = SubprocessScriptLauncher(env, num_processes=2, num_nodes=1).launch(join, env)
    tensor = torch.ones(1000)
    print(f"teardown-job rank={rank} ends", flush=True)
    if rank == 1:
        sys.setswitchinterval(60)  # a thread that waits for the GIL never asks for it
        work = dist.all_reduce(tensor, async_op=True)
        del work  # now only the worker thread holds the finished work
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:  # rank 0 joins, the worker finishes and waits for the GIL
            pass
    else:
        dist.all_reduce(tensor)


if __name__ == "__main__":
    main()
