"""A two-process gloo job started with SubprocessScriptLauncher; tests/test_launch.py runs it.

Run it as:

    python tests/scripts/launch_job.py SCENARIO [READY_DIR]

Every process prints ``launch-test rank=R pid=P`` first. SCENARIO picks what goes wrong:
``ok`` and ``two_launches`` (nothing), ``raise_rank1``/``raise_rank0`` (a ValueError while the
other rank waits in an all_reduce), ``raise_rank1_before_init``, ``kill_rank1`` (SIGKILL while
rank 0 waits in an all_reduce), ``kill_rank0`` (rank 0 SIGKILLs itself while rank 1 sleeps),
``sigint_rank0`` (rank 0 creates READY_DIR/rank0_waiting and sleeps until the test sends it
SIGINT; rank 1 waits in an all_reduce).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from fullshard.launch import LocalEnvironment, SubprocessScriptLauncher, wait_for_local_children


def work(scenario: str, env: LocalEnvironment, ready_dir: str | None) -> float:
    rank = env.local_rank()
    print(f"launch-test rank={rank} pid={os.getpid()}", flush=True)
    if scenario == "raise_rank1_before_init" and rank == 1:
        raise ValueError("boom on rank 1")
    if not dist.is_initialized():  # a second launch reuses the group, as the Trainer does
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{env.main_address}:{env.main_port}",
            rank=rank,
            world_size=2,
            timeout=timedelta(seconds=60),
        )
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    if rank == 1 and scenario == "raise_rank1":
        raise ValueError("boom on rank 1")
    if rank == 1 and scenario == "kill_rank1":
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == 1 and scenario == "kill_rank0":
        time.sleep(60)
    if rank == 0 and scenario == "raise_rank0":
        time.sleep(0.5)  # let rank 1 enter the next all_reduce
        raise ValueError("boom on rank 0")
    if rank == 0 and scenario == "kill_rank0":
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == 0 and scenario == "sigint_rank0":
        assert ready_dir is not None
        # Short sleeps, as a training loop runs bytecode all along: a SIGINT that the kernel hands
        # to another thread (gloo's, the watchdog's) interrupts no sleep of the main thread, whose
        # handler runs at its next bytecode. Should the job still hang, every thread's stack goes
        # to stderr (the test shows it).
        faulthandler.dump_traceback_later(30, exit=False)
        (Path(ready_dir) / "rank0_waiting").touch()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.05)
    dist.all_reduce(total)
    return total.item()


def main() -> None:
    scenario = sys.argv[1]
    if scenario == "sigint_rank0":
        # Ctrl-C as in a terminal. A shell without job control starts a background command (`bash
        # .ci/run &`, a CI runner's step) with SIGINT ignored; every process below inherits that,
        # and python then installs no KeyboardInterrupt handler, so the test's SIGINT did nothing.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    ready_dir = sys.argv[2] if len(sys.argv) > 2 else None
    env = LocalEnvironment()
    launcher = SubprocessScriptLauncher(env, num_processes=2, num_nodes=1)
    results = [launcher.launch(work, scenario, env, ready_dir)]
    if scenario == "two_launches":
        results.append(launcher.launch(work, scenario, env, ready_dir))
    print(f"launch-test rank={env.local_rank()} results={results}", flush=True)
    # Tear down once, at the end; rank 0 hosts the store and lets rank 1 leave first.
    dist.barrier()
    if env.local_rank() == 0:
        wait_for_local_children()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
