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
Python dispatch, no kernels), so :func:`run_forked` runs the steps in one forked child per usable
core. The children take the steps from a queue, the next one each time one is done (a counter
they share: :class:`_Queue`), rather than a fixed share each: steps differ in cost (a model cut
to more blocks, checkpointing, the step that also counts FLOPs), and a core that another job
shares runs slower; so no child idles while another has a backlog, and a caller that lists the
dearest steps first leaves the cheap ones for the end. A child sends back its results with
their indices. A child is a copy of the planning process (copy-on-write: the meta model is not
copied again), makes its own fake process group, and exits with ``os._exit``. One worker, or one
job, runs in this process, without a fork; so does a process that runs other Python threads: a
fork copies the calling thread only, and a lock another thread held at that moment stays held in
the child for ever (a planner test hung so in a pytest-xdist worker, whose receiver thread is
always running). Planning beside a job's group (above) must fork, threads or not.
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
    """Each of ``jobs`` run in one of ``workers`` forked children, which take them in order as
    they finish the one before (see [Note: simulating on several cores]); their results, in the
    order of ``jobs``. ``forget_group``: the children forget this process's process group first
    (see [Note: planning inside a running job]).

    Raises:
        a failing job's exception (re-raised here: the first in ``jobs``'s order of those that ran;
        one that cannot be pickled becomes a MisconfigurationError with its traceback), or
        MisconfigurationError when a child dies without a result.
    """
    if not forget_group and (workers <= 1 or len(jobs) <= 1 or _other_python_threads()):
        return [job() for job in jobs]
    workers = max(1, min(workers, len(jobs)))
    queue = _Queue(len(jobs))
    children = []
    for _ in range(workers):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            _child(jobs, queue, read, write, forget_group)
        os.close(write)
        children.append((pid, read))
    done: dict[int, tuple[bool, Any]] = {}
    for pid, read in children:  # each child writes to its own pipe only: read them in turn
        with os.fdopen(read, "rb") as pipe:
            data = pipe.read()
        _, status = os.waitpid(pid, 0)
        if not data:
            raise MisconfigurationError(
                f"A planner process (pid {pid}) ended with status {status} and no result. Plan with workers=1 to "
                "see the error in this process, or plan before the job starts (`fullshard plan SCRIPT:FACTORY`)."
            )
        done.update(pickle.loads(data))
    for index in sorted(done):
        ok, value = done[index]
        if not ok:
            raise value
    return [done[index][1] for index in range(len(jobs))]


class _Queue:
    """The indices of ``size`` jobs, handed out in order to the forked children that share it (a
    counter in shared memory under a lock: see [Note: simulating on several cores])."""

    def __init__(self, size: int) -> None:
        import multiprocessing

        self._size = size
        self._next = multiprocessing.Value("l", 0)  # made before the fork: every child shares it

    def take(self) -> int | None:
        """The next job's index; None when every job is taken (or :meth:`close` was called)."""
        with self._next.get_lock():
            index = int(self._next.value)
            if index >= self._size:
                return None
            self._next.value = index + 1
        return index

    def close(self) -> None:
        """Hand out no more jobs (a job failed: the plan fails, the rest need not run)."""
        with self._next.get_lock():
            self._next.value = self._size


def _child(
    jobs: Sequence[Callable[[], Any]], queue: _Queue, read: int, write: int, forget_group: bool
) -> None:
    status = 0
    try:
        os.close(read)
        # one intra-op thread, as torch's DataLoader workers: a forked child's first parallel
        # region can hang in GNU OpenMP when the parent had used its thread pool before the fork
        # (a planner test timed out in CI after 300 s waiting for a child's result)
        torch.set_num_threads(1)
        if forget_group:
            torch_tools.forget_process_group()
        share: dict[int, tuple[bool, Any]] = {}
        while (index := queue.take()) is not None:
            try:
                share[index] = (True, jobs[index]())
            except BaseException as error:  # sent back and raised in the parent
                share[index] = (False, _picklable(error))
                queue.close()
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
