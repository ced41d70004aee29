"""Launchers: start one process per device, and make a failure in any of them end the whole job.

``SubprocessScriptLauncher`` (here) re-runs the user's command once per extra device (``python
train.py`` becomes N processes, each copy started through :mod:`fullshard.launch.rerun_main`,
which ends it without finalizing the interpreter); ``SpawnLauncher``
(:mod:`fullshard.launch.spawn`) starts the processes with ``torch.multiprocessing`` and works
where there is no script to re-run (notebooks, with ``start_method="fork"``).

[Note: a failure ends the job]
A distributed job whose processes wait on each other must never hang because one of them
died. The process that started the others (rank 0 of the node) watches them from a daemon
thread; when one exits non-zero it says so on stderr, ends the rest and ends itself with
``os._exit`` (its main thread may be stuck inside a C++ collective, where no Python
exception or signal handler can reach it). When rank 0 itself fails, it ends the others
before re-raising; when it is killed outright, each child notices from a watchdog thread that
its parent is gone and ends itself. A process that is stuck rather than failed ends itself
after a while, which this same path turns into the end of the job ([Note: stuck ranks] in
:mod:`fullshard.launch.stuck_ranks`; :func:`end_job`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import types
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from typing_extensions import override

from fullshard.errors import MisconfigurationError, ProcessFailedError
from fullshard.launch import stuck_ranks
from fullshard.launch.environments import ClusterEnvironment

__all__ = ["Launcher", "SubprocessScriptLauncher", "end_job", "wait_for_local_children"]

T = TypeVar("T")

# Set by the launchers for the processes they start: the pid of the process that started them.
LAUNCHER_PID_VAR = "FULLSHARD_LAUNCHER_PID"
_CHILD_POLL_S = 0.2  # how often rank 0 looks at its children
_PARENT_POLL_S = 0.5  # how often a child checks that its launcher is alive
_TERMINATE_GRACE_S = 3.0  # between SIGTERM and SIGKILL when ending processes
# The same for end_job: its process is stuck or waits for a stuck one, and so do its children,
# which ignore SIGTERM meanwhile (inside fit it only asks for a preemption checkpoint at the next
# step, which never comes; in a C++ collective no Python handler runs at all).
_END_JOB_TERMINATE_GRACE_S = 0.5


class Launcher(ABC):
    """Starts the processes of a job and runs a function in each of them."""

    @property
    @abstractmethod
    def is_interactive_compatible(self) -> bool:
        """Whether this launcher works in an interactive session (a notebook, a REPL)."""

    @abstractmethod
    def launch(self, function: Callable[..., T], *args: Any, trainer: Any = None, **kwargs: Any) -> T:
        """Run ``function(*args, **kwargs)`` in every process of the job and return what it
        returned in this process. ``trainer`` is the host object, if any, whose state must
        reach this process when the function ran elsewhere."""


def _check_counts(num_processes: int, num_nodes: int) -> None:
    if num_processes < 1 or num_nodes < 1:
        raise MisconfigurationError(
            f"A launcher needs at least one process per node and one node, got num_processes={num_processes},"
            f" num_nodes={num_nodes}. Pass devices >= 1 and num_nodes >= 1."
        )


def _describe_exit(code: int) -> str:
    if code >= 0:
        return f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"was killed by {name}"


def _shell_exit_code(code: int) -> int:
    """The exit code a shell reports for a process that ended with Popen return code ``code``."""
    return code if code > 0 else 128 - code


@dataclass(frozen=True)
class _JobSettings:
    """What every process of a launched job receives through its environment."""

    main_address: str
    main_port: int
    node_rank: int
    num_processes: int
    num_nodes: int
    launcher_pid: int

    @classmethod
    def from_environment(
        cls, cluster_environment: ClusterEnvironment, num_processes: int, num_nodes: int
    ) -> _JobSettings:
        return cls(
            main_address=cluster_environment.main_address,
            main_port=cluster_environment.main_port,
            node_rank=cluster_environment.node_rank(),
            num_processes=num_processes,
            num_nodes=num_nodes,
            launcher_pid=os.getpid(),
        )

    def global_rank(self, local_rank: int) -> int:
        return self.node_rank * self.num_processes + local_rank

    def environ(self, local_rank: int) -> dict[str, str]:
        """The job variables of process ``local_rank``."""
        return {
            "LOCAL_RANK": str(local_rank),
            "NODE_RANK": str(self.node_rank),
            "WORLD_SIZE": str(self.num_processes * self.num_nodes),
            "MASTER_ADDR": self.main_address,
            "MASTER_PORT": str(self.main_port),
        }


# ---------------------------------------------------------------------------------------------
# Children: notice when the launcher is gone.


def _watch_launcher_from_environ() -> None:
    """In a process started by our launcher, start the watchdog (once)."""
    value = os.environ.pop(LAUNCHER_PID_VAR, None)  # popped: processes this one starts are not ours
    if value is not None and value.isdigit():
        _start_launcher_watchdog(int(value))


def _start_launcher_watchdog(launcher_pid: int) -> None:
    """End this process promptly (``os._exit``) once the process that started it is gone.

    PR_SET_PDEATHSIG is not used: it fires when the parent *thread* that forked us ends, which
    may be long before the parent process does. Polling the parent pid is portable and, at
    every half second, prompt enough.
    """
    if os.getppid() != launcher_pid:
        try:
            os.kill(launcher_pid, 0)
        except ProcessLookupError:
            _exit_orphaned(launcher_pid)
        # Alive but not our parent: the variable was inherited by a grandchild. Not ours to watch.
        return
    threading.Thread(
        target=_watch_launcher, args=(launcher_pid,), name="fullshard-launcher-watchdog", daemon=True
    ).start()


def _watch_launcher(launcher_pid: int) -> None:
    while os.getppid() == launcher_pid:
        time.sleep(_PARENT_POLL_S)
    _exit_orphaned(launcher_pid)


def _exit_orphaned(launcher_pid: int) -> None:
    print(
        f"fullshard: the launching process (pid {launcher_pid}) is gone; ending this process"
        f" (pid {os.getpid()}, LOCAL_RANK={os.environ.get('LOCAL_RANK', '?')})",
        file=sys.stderr,
        flush=True,
    )
    os._exit(1)


# ---------------------------------------------------------------------------------------------
# Rank 0: the children it started and the monitor that watches them.


def _end_processes(
    processes: Sequence[subprocess.Popen[bytes]], grace_s: float = _TERMINATE_GRACE_S
) -> dict[int, signal.Signals]:
    """SIGTERM the processes still running, then SIGKILL those that outlive ``grace_s``.

    Returns, by pid, the last signal sent to each process this call had to end.
    """
    alive = [process for process in processes if process.poll() is None]
    sent: dict[int, signal.Signals] = {}
    for process in alive:
        process.terminate()
        sent[process.pid] = signal.SIGTERM
    deadline = time.monotonic() + grace_s
    for process in alive:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            process.kill()
            sent[process.pid] = signal.SIGKILL
            process.wait()
    return sent


@dataclass(frozen=True)
class _Child:
    rank: int
    process: subprocess.Popen[bytes]

    def describe(self, code: int) -> str:
        return f"rank {self.rank} (pid {self.process.pid}) {_describe_exit(code)}"


class _LocalJob:
    """The children rank 0 started, watched for the rest of rank 0's life.

    [Note: children outlive a launch]
    A script may call the Trainer several times (fit, then validate). The children re-run the
    whole script, so they make the same calls, and each call needs every rank. Rank 0 therefore
    starts the children on its first launch only and then sets ``LOCAL_RANK=0`` (and the other
    job variables) in its own environment, so that later launches, like the children's, just
    run the function. Rank 0 cannot wait for the children when a launch returns: they may
    already be inside the next call, waiting for rank 0. It waits for them when the interpreter
    exits, and the monitor thread watches them all along.
    """

    def __init__(self, rank: int, children: list[_Child]) -> None:
        self._rank = rank
        self._children = children
        self._lock = threading.Lock()
        self._stopped = False
        self._monitor = threading.Thread(target=self._watch, name="fullshard-child-monitor", daemon=True)
        self._monitor.start()
        atexit.register(self._at_exit)

    def run(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``function`` in rank 0; if it raises (KeyboardInterrupt too), end the children,
        unless every rank ends this way on purpose (see :func:`expect_exit_code`)."""
        if self._stopped:
            raise ProcessFailedError(
                "The other processes of this job were stopped after an earlier failure, so this process"
                " cannot run a distributed function any more. Fix the failure and start the script again."
            )
        try:
            return function(*args, **kwargs)
        except SystemExit as stop:
            if stop.code != _expected_exit_code or _expected_exit_code is None:
                self.stop()
            raise
        except BaseException:
            self.stop()
            raise

    def stop(self, grace_s: float = _TERMINATE_GRACE_S) -> None:
        """End the children because this process failed (the monitor must not report them),
        SIGKILLing those that outlive SIGTERM by ``grace_s``."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            print(
                f"fullshard: rank {self._rank} (pid {os.getpid()}) failed; stopping the other processes",
                file=sys.stderr,
                flush=True,
            )
            sent = _end_processes([child.process for child in self._children], grace_s)
            for child in self._children:
                code = child.process.returncode
                ended_by_us = child.process.pid in sent and code == -sent[child.process.pid]
                if code != 0 and not ended_by_us:  # it failed on its own, likely first
                    print(
                        f"fullshard: {child.describe(code)}; its traceback, if any, is above", file=sys.stderr
                    )
            sys.stderr.flush()

    def _watch(self) -> None:
        while not self._stopped:
            time.sleep(_CHILD_POLL_S)
            codes = [(child, child.process.poll()) for child in self._children]
            for child, code in codes:
                if code is not None and code not in (0, _expected_exit_code):
                    self._fail(child, code)
                    return
            if all(code is not None and code in (0, _expected_exit_code) for _, code in codes):
                return

    def _fail(self, failed: _Child, code: int) -> None:
        """A child failed: say so, end the others and this process (see [Note: a failure ends the job])."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            print(
                f"fullshard: {failed.describe(code)}; stopping the other processes (its traceback, if"
                " any, is above)",
                file=sys.stderr,
                flush=True,
            )
            _end_processes([child.process for child in self._children if child is not failed])
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(_shell_exit_code(code))

    def _at_exit(self) -> None:
        # Python sets sys.last_value when an uncaught exception ends the program: the children
        # may be waiting for rank 0 in a call it will never make, so end them instead of waiting.
        last = getattr(sys, "last_value", None)
        if last is not None and not (isinstance(last, SystemExit) and last.code == _expected_exit_code):
            self.stop()
            return
        self._monitor.join()  # returns once all children exited 0; ends this process otherwise


_running_job: _LocalJob | None = None
_expected_exit_code: int | None = None


def expect_exit_code(code: int) -> None:
    """Every rank of the job is about to end with exit status ``code`` on purpose (preemption:
    each saved its part of the checkpoint): the processes rank 0 started ending with it is not a
    failure that must end the others (see [Note: a failure ends the job])."""
    global _expected_exit_code
    _expected_exit_code = code


def wait_for_local_children() -> None:
    """In a rank 0 that started its node's other processes, wait until they have exited.

    Rank 0 hosts the process group's rendezvous store, so it tears the group down only once no
    child is still leaving it; the wait also gives rank 0's own gloo workers that long to drop
    their last work before rank 0 finalizes (see [Note: a launched copy leaves with os._exit] in
    :mod:`fullshard.launch.rerun_main`). A child that fails ends the job as usual. Does nothing in
    other processes.
    """
    job = _running_job
    if job is not None and not job._stopped:
        job._monitor.join(timeout=60)  # a child stuck in its own teardown must not keep rank 0 forever


def end_job(status: int) -> NoReturn:
    """End this process at once with ``status``, from any thread, and the processes it started.

    For a process whose main thread cannot be reached (stuck in user code or in a C++
    collective; see [Note: stuck ranks] in :mod:`fullshard.launch.stuck_ranks`). In a rank 0
    that started its node's other processes, those are ended first (SIGKILL half a second after
    SIGTERM: they wait for this process in collectives); elsewhere the launcher (or torchrun, or
    ``srun --kill-on-bad-exit``) sees this process fail and ends the job.
    """
    job = _running_job
    if job is not None:
        job.stop(_END_JOB_TERMINATE_GRACE_S)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()
    os._exit(status)


# Runs the program as python would, then leaves without finalizing the interpreter: see
# [Note: a launched copy leaves with os._exit] in that file.
RERUN_MAIN = str(Path(__file__).with_name("rerun_main.py"))


def _rerun_command(main_module: types.ModuleType, argv: Sequence[str], executable: str) -> list[str]:
    """The command that starts this program again, as the user started it, through
    :data:`RERUN_MAIN`."""
    if not hasattr(main_module, "__file__") or not argv:
        raise MisconfigurationError(
            "SubprocessScriptLauncher starts one more copy of your program per extra device, but this"
            " Python session has no script to start again (interactive shell, notebook or `python -c`)."
            " Run your code as a script (`python train.py`), or start the processes from this session:"
            " strategy='ddp_notebook' (SpawnLauncher with start_method='fork'; for FSDP,"
            " FSDPStrategy(start_method='fork'))."
        )
    spec = getattr(main_module, "__spec__", None)
    if spec is not None:  # started with `python -m name`
        name = spec.name.removesuffix(".__main__")
        return [executable, RERUN_MAIN, "-m", name, *argv[1:]]
    return [executable, RERUN_MAIN, os.path.abspath(argv[0]), *argv[1:]]


QUIET_START_FILTER = "ignore"
QUIET_START_VAR = "FULLSHARD_QUIET_START"
"""[Note: warnings once]
A re-run copy of the user's script repeats every warning rank 0 already printed while importing
and building things (torch's own, at import; the script's). Those copies start with this
filter ahead of the user's own ``PYTHONWARNINGS``; the strategy removes it once the process
joins the job (``ParallelStrategy.setup_environment``), so warnings raised while training, which
may be specific to a rank, still show. fullshard's own warnings are issued on rank 0 only."""


def _start_local_job(settings: _JobSettings) -> _LocalJob:
    """Start local ranks 1..N-1 by running the user's command again, and watch them."""
    command = _rerun_command(sys.modules["__main__"], sys.argv, sys.executable)
    children: list[_Child] = []
    try:
        for local_rank in range(1, settings.num_processes):
            environ = {
                **os.environ,
                **settings.environ(local_rank),
                LAUNCHER_PID_VAR: str(settings.launcher_pid),
                # see [Note: warnings once]
                "PYTHONWARNINGS": ",".join(
                    filter(None, [QUIET_START_FILTER, os.environ.get("PYTHONWARNINGS")])
                ),
                QUIET_START_VAR: "1",
            }
            # stdout/stderr are inherited, so each child's traceback reaches the terminal.
            process = subprocess.Popen(command, env=environ)
            children.append(_Child(rank=settings.global_rank(local_rank), process=process))
    except BaseException:
        _end_processes([child.process for child in children])
        raise
    os.environ.update(settings.environ(0))  # see [Note: children outlive a launch]
    return _LocalJob(settings.global_rank(0), children)


class SubprocessScriptLauncher(Launcher):
    """Runs the user's command once more per extra local device (``python train.py`` or
    ``python -m pkg``), with ``LOCAL_RANK``, ``NODE_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
    ``MASTER_PORT`` set for each copy.

    Where the processes already exist (torchrun, SLURM, or a copy started by this launcher),
    ``launch`` just calls the function. Any process failing ends the whole job with a non-zero
    exit code; see [Note: a failure ends the job] in this module. A copy ends with the exit
    status ``python`` would have given it, without finalizing its interpreter; see
    [Note: a launched copy leaves with os._exit] in :mod:`fullshard.launch.rerun_main`.
    """

    def __init__(self, cluster_environment: ClusterEnvironment, num_processes: int, num_nodes: int) -> None:
        _check_counts(num_processes, num_nodes)
        self.cluster_environment = cluster_environment
        self.num_processes = num_processes
        self.num_nodes = num_nodes

    @property
    @override
    def is_interactive_compatible(self) -> bool:
        return False

    @override
    def launch(self, function: Callable[..., T], *args: Any, trainer: Any = None, **kwargs: Any) -> T:
        global _running_job
        if _running_job is None:
            if self.cluster_environment.creates_processes_externally:
                _watch_launcher_from_environ()
            elif self.num_processes > 1:
                settings = _JobSettings.from_environment(
                    self.cluster_environment, self.num_processes, self.num_nodes
                )
                _running_job = _start_local_job(settings)
        with stuck_ranks.launched():
            if _running_job is None:
                return function(*args, **kwargs)
            return _running_job.run(function, *args, **kwargs)
