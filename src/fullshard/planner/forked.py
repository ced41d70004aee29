"""Run the planner's work in forked processes: beside a job's process group, and on several cores.

[Note: planning inside a running job]
The simulation needs this process to be rank 0 of a fake process group of the planned size, but
a strategy plans (``plan="auto"``) after the job's real group is up, and a process has one default
group. So where a group exists, the planner forks: the child forgets the parent's group (never
using it), plans, sends the result back through a pipe and exits at once with ``os._exit``, so
nothing of the parent's group is torn down. Nothing is computed on real tensors in the child
(fake tensors only), so the parent's thread pools are not needed there.

[Note: simulating on several cores]
Each candidate's simulated step is independent of the others and runs on one core (fake tensors:
Python dispatch, no kernels), so :func:`run_forked` deals the steps to one forked child per
usable core, round-robin, each child running its share in turn and sending back its results in
order. A child is a copy of the planning process (copy-on-write: the meta model is not copied
again), makes its own fake process group, and exits with ``os._exit``. One worker, or one job,
runs in this process, without a fork; so does a process that runs other Python threads: a fork
copies the calling thread only, and a lock another thread held at that moment stays held in the
child for ever (a planner test hung so in a pytest-xdist worker, whose receiver thread is always
running). Planning beside a job's group (above) must fork, threads or not.
"""

from __future__ import annotations

import os
import pickle
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from fullshard.errors import MisconfigurationError
from fullshard.planner import torch_tools

T = TypeVar("T")


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _other_python_threads() -> bool:
    """Whether another thread runs Python code in this process: every such thread has a frame in
    ``sys._current_frames()``, also one started with ``_thread.start_new_thread``, which
    ``threading.active_count()`` does not count (pytest-xdist's receiver thread is one)."""
    return len(sys._current_frames()) > 1


def run_forked(jobs: Sequence[Callable[[], T]], workers: int, *, forget_group: bool = False) -> list[T]:
    """Each of ``jobs`` run in one of ``workers`` forked children (see [Note: simulating on several
    cores]); their results, in the order of ``jobs``. ``forget_group``: the children forget this
    process's process group first (see [Note: planning inside a running job]).

    Raises:
        the first failing job's exception (re-raised here; one that cannot be pickled becomes a
        MisconfigurationError with its traceback), or MisconfigurationError when a child dies
        without a result.
    """
    if not forget_group and (workers <= 1 or len(jobs) <= 1 or _other_python_threads()):
        return [job() for job in jobs]
    workers = max(1, min(workers, len(jobs)))
    children = []
    for index in range(workers):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            _child(list(jobs[index::workers]), read, write, forget_group)
        os.close(write)
        children.append((pid, read))
    shares = []
    for pid, read in children:  # each child writes to its own pipe only: read them in turn
        with os.fdopen(read, "rb") as pipe:
            data = pipe.read()
        _, status = os.waitpid(pid, 0)
        if not data:
            raise MisconfigurationError(
                f"A planner process (pid {pid}) ended with status {status} and no result. Plan with workers=1 to "
                "see the error in this process, or plan before the job starts (`fullshard plan SCRIPT:FACTORY`)."
            )
        shares.append(pickle.loads(data))
    results: list[Any] = [None] * len(jobs)
    for index, share in enumerate(shares):
        for offset, (ok, value) in enumerate(share):
            if not ok:
                raise value
            results[index + offset * workers] = value
    return results


def _child(jobs: list[Callable[[], Any]], read: int, write: int, forget_group: bool) -> None:
    status = 0
    try:
        os.close(read)
        # one intra-op thread, as torch's DataLoader workers: a forked child's first parallel
        # region can hang in GNU OpenMP when the parent had used its thread pool before the fork
        # (a planner test timed out in CI after 300 s waiting for a child's result)
        torch.set_num_threads(1)
        if forget_group:
            torch_tools.forget_process_group()
        share: list[tuple[bool, Any]] = []
        for job in jobs:
            try:
                share.append((True, job()))
            except BaseException as error:  # sent back and raised in the parent
                share.append((False, _picklable(error)))
                break
        data = pickle.dumps(share)
        with os.fdopen(write, "wb") as pipe:
            pipe.write(data)
    except BaseException:
        status = 1
    finally:
        os._exit(status)


def _picklable(error: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        text = "".join(traceback.format_exception(error))
        return MisconfigurationError(f"The planner failed in a worker process:\n{text}")
    return error
