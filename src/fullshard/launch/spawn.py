"""SpawnLauncher: start the processes of a job with ``torch.multiprocessing``; for notebooks and
other sessions without a script to re-run.

[Note: the spawn payload]
With "spawn" or "forkserver", multiprocessing pickles each ``Process`` object into a pipe that
the new interpreter reads as it starts. CPython keeps its own copy of the pipe's read end open
until that write has finished (python/cpython#118981, fixed after 3.11), so a child that dies
before reading everything, typically because it cannot import a class the parent pickled by
name (one defined in a notebook or in ``python -c``), leaves a parent writing a payload larger
than the pipe buffer blocked forever. So the ``Process`` objects stay small (settings, queues,
pipe ends), and what the function needs travels on a pipe of our own:

1. Before any process starts, the parent pickles the function, its arguments and the trainer
   once (:func:`~fullshard.launch.payload.pickle_payload`). Something that does not pickle, or
   a class the children cannot import, is reported there with the fix, and nothing starts.
2. Once the processes exist, the parent closes its copies of their read ends and writes the
   bytes to each from a daemon thread: a child that died makes the write fail (EPIPE) instead
   of block, and the join loop reports that child's failure.
3. Each child reads and unpickles its copy in :func:`_spawned_main`; what it cannot rebuild is
   reported to the parent with the same advice.

"fork" needs none of this: the children are copies of the parent and receive the objects as
they are.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, TypeVar, cast

import torch
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import (
    ProcessContext,
    ProcessExitedException,
    ProcessRaisedException,
    start_processes,
)
from typing_extensions import override

from fullshard.errors import MisconfigurationError, ProcessFailedError
from fullshard.launch import stuck_ranks
from fullshard.launch.environments import ClusterEnvironment
from fullshard.launch.launchers import (
    _CHILD_POLL_S,
    _TERMINATE_GRACE_S,
    Launcher,
    _check_counts,
    _JobSettings,
    _start_launcher_watchdog,
)
from fullshard.launch.payload import SpawnPayload, pickle_payload, unpickle_payload

__all__ = ["SpawnLauncher", "check_fork_is_safe", "check_start_method"]

T = TypeVar("T")

# A failure report at most this big (bytes of text) is written to its pipe in one atomic write
# (PIPE_BUF is 4096 on Linux), so a process ended mid-report never leaves half a message that
# the parent would wait on for ever. The whole traceback is on the process's stderr.
_MAX_REPORT_BYTES = 3500


def check_start_method(start_method: str) -> None:
    """Refuse a start method this platform lacks, or "fork" where forking is unsafe."""
    available = mp.get_all_start_methods()
    if start_method not in available:
        if start_method == "fork":
            raise MisconfigurationError(
                f"start_method='fork' (strategy='ddp_fork' / 'ddp_notebook') is not available on this platform"
                f" ({sys.platform} has no fork). Use start_method='spawn' (strategy='ddp_spawn') with the model,"
                " the data and their classes defined in an importable .py module, or run a script with"
                " strategy='ddp'."
            )
        raise MisconfigurationError(
            f"start_method={start_method!r} is not available on this platform; choose one of {available}."
        )
    if start_method == "fork":
        check_fork_is_safe()


def check_fork_is_safe() -> None:
    """Forked processes cannot use CUDA once the parent has initialised it."""
    if torch.cuda.is_initialized():
        raise MisconfigurationError(
            "start_method='fork' (strategy='ddp_fork' / 'ddp_notebook') cannot start processes after CUDA was"
            " initialised in this process: a forked process cannot use CUDA then (torch fails with 'Cannot"
            " re-initialize CUDA in forked subprocess'). Something here already used the GPU (a tensor or model"
            " moved to 'cuda', a torch.cuda call). Restart the session and leave the GPU alone until fit, or"
            " use start_method='spawn' (strategy='ddp_spawn') with the model and data defined in an"
            " importable .py module."
        )


@dataclass(frozen=True)
class _SpawnOutcome:
    """What local rank 0 sends back to the parent: the function's return value."""

    value: Any


@dataclass(frozen=True)
class _SpawnFailure:
    """What a spawned process that failed sends back: who it was and what went wrong (its
    traceback, or a message where the traceback would only show pickle's internals)."""

    local_rank: int
    report: str


@dataclass(frozen=True)
class _SpawnChannels:
    """Queues from the spawned processes to the parent.

    Failures have their own queue: they are small and are read after the processes were
    ended, when a result cut off mid-write could block the reader of a shared queue. The order
    in which failures arrive is the order in which the processes failed, so the first one is
    the likely cause (a crash in one rank makes the others' collectives fail next).
    """

    results: Any  # SimpleQueue of _SpawnOutcome, pickled (see [Note: spawn results travel as bytes])
    failures: Any  # SimpleQueue of _SpawnFailure


def _bounded(text: str) -> str:
    data = text.encode()
    if len(data) <= _MAX_REPORT_BYTES:
        return text
    tail = data[-_MAX_REPORT_BYTES:].decode(errors="ignore")
    return f"[... cut; the whole text is on that process's stderr]\n{tail}"


def _report_failure(channels: _SpawnChannels, local_rank: int, text: str) -> None:
    print(f"fullshard: spawned local rank {local_rank} failed:\n{text}", file=sys.stderr, flush=True)
    channels.failures.put(_SpawnFailure(local_rank=local_rank, report=_bounded(text)))


def _receive_payload(readers: list[Connection], local_rank: int, start_method: str) -> SpawnPayload:
    """This process's payload from its pipe (see [Note: the spawn payload])."""
    for rank, reader in enumerate(readers):
        if rank != local_rank:
            reader.close()  # the parent's writes to the others must fail when those processes die
    reader = readers[local_rank]
    try:
        data = reader.recv_bytes()
    finally:
        reader.close()
    return unpickle_payload(data, local_rank, start_method)


def _spawned_main(
    local_rank: int,
    settings: _JobSettings,
    source: SpawnPayload | list[Connection],
    channels: _SpawnChannels,
    start_method: str,
) -> None:
    """Entry point of each spawned process (module level so that it pickles). ``source`` is the
    payload itself under "fork", else the read ends of the payload pipes, one per local rank."""
    os.environ.update(settings.environ(local_rank))
    if start_method == "fork":
        # A forked child inherits the parent's OpenMP thread pool without its threads: its
        # first multi-threaded op hangs once the parent has run one (GNU libgomp is not
        # fork-safe; pytorch/pytorch#17199, #41197). One thread never enters the pool, and
        # OMP_NUM_THREADS tells the strategy that the thread count is already chosen.
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)
    _start_launcher_watchdog(settings.launcher_pid)
    try:
        if isinstance(source, SpawnPayload):
            payload = source
        else:
            payload = _receive_payload(source, local_rank, start_method)
    except Exception as error:  # the traceback would show pickle's internals: the message says it all
        _report_failure(channels, local_rank, f"{type(error).__name__}: {error}")
        raise
    try:
        with stuck_ranks.launched():
            value = payload.function(*payload.args, **payload.kwargs)
        if local_rank == 0:
            # [Note: spawn results travel as bytes]
            # torch.multiprocessing's queues send a tensor as a handle to shared memory that the
            # receiver can open only while the sender is alive, and this process exits right
            # after sending. Plain pickle copies the tensors' data into the bytes instead.
            channels.results.put(pickle.dumps(_SpawnOutcome(value=value)))
    except Exception:
        _report_failure(channels, local_rank, traceback.format_exc())
        raise


def _send_payload(writer: Connection, data: bytes) -> None:
    try:
        writer.send_bytes(data)
    except OSError:  # the process died before reading it all; the join loop reports why
        pass
    finally:
        writer.close()


def _restore_environ(saved: dict[str, str]) -> None:
    for name in [name for name in os.environ if name not in saved]:
        del os.environ[name]
    for name, value in saved.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


class SpawnLauncher(Launcher):
    """Starts ``num_processes`` fresh processes with ``torch.multiprocessing`` and runs the
    function in each; for notebooks and other sessions without a script to re-run.

    Local rank 0 of every node sends its return value back to the calling process, where
    ``launch`` returns it (the Trainer's function returns its state with it, see
    fullshard.trainer.trainer).

    ``start_method="fork"`` (what ``strategy="ddp_notebook"`` uses) starts the processes as
    copies of this one: nothing is pickled, so classes defined in a notebook work; on CPU each
    computes on one thread (more would hang, see ``_spawned_main``); it is refused once CUDA is
    initialised here. ``"spawn"`` and ``"forkserver"`` start fresh interpreters: the function,
    its arguments and the trainer are pickled (tensors copied) and every class and function they
    use must be importable; both are checked before any process starts (see [Note: the spawn
    payload]).

    When a process fails, the others are ended and :class:`ProcessFailedError` carries the
    report of the first one that failed. ``os.environ`` is left as it was found.
    """

    def __init__(
        self,
        cluster_environment: ClusterEnvironment,
        num_processes: int,
        num_nodes: int,
        start_method: str = "spawn",
    ) -> None:
        _check_counts(num_processes, num_nodes)
        check_start_method(start_method)
        self.cluster_environment = cluster_environment
        self.num_processes = num_processes
        self.num_nodes = num_nodes
        self.start_method = start_method

    @property
    @override
    def is_interactive_compatible(self) -> bool:
        # Spawned processes import classes and functions by name; what a notebook defines cannot be.
        return self.start_method == "fork"

    @override
    def launch(self, function: Callable[..., T], *args: Any, trainer: Any = None, **kwargs: Any) -> T:
        payload = SpawnPayload(args=args, kwargs=kwargs, function=function, trainer=trainer)
        forked = self.start_method == "fork"
        if forked:
            check_fork_is_safe()  # CUDA may have been initialised since this launcher was made
        # Pickled (and checked) before any process starts; forked processes need no copy.
        data = b"" if forked else pickle_payload(payload, self.start_method)
        saved_environ = dict(os.environ)
        try:
            settings = _JobSettings.from_environment(
                self.cluster_environment, self.num_processes, self.num_nodes
            )
            mp_context = mp.get_context(self.start_method)
            channels = _SpawnChannels(results=mp_context.SimpleQueue(), failures=mp_context.SimpleQueue())
            process_context, senders = self._start(settings, channels, payload, data)
            try:
                outcome = _join_collecting(process_context, channels)
            finally:
                for sender in senders:  # done, or failing (EPIPE) now that the processes are gone
                    sender.join(timeout=_TERMINATE_GRACE_S)
        finally:
            _restore_environ(saved_environ)
        return cast(T, outcome.value)

    def _start(
        self, settings: _JobSettings, channels: _SpawnChannels, payload: SpawnPayload, data: bytes
    ) -> tuple[ProcessContext, list[threading.Thread]]:
        """Start the processes, and (unless forked) the threads that send them ``data``."""
        forked = self.start_method == "fork"
        mp_context = mp.get_context(self.start_method)
        pipes = [] if forked else [mp_context.Pipe(duplex=False) for _ in range(self.num_processes)]
        source = payload if forked else [reader for reader, _ in pipes]
        try:
            process_context = start_processes(
                _spawned_main,
                args=(settings, source, channels, self.start_method),
                nprocs=self.num_processes,
                join=False,
                start_method=self.start_method,
            )
        except BaseException:
            for _, writer in pipes:
                writer.close()
            raise
        finally:
            for reader, _ in pipes:
                reader.close()  # see [Note: the spawn payload]
        senders = [
            threading.Thread(
                target=_send_payload, args=(writer, data), name=f"fullshard-payload-{rank}", daemon=True
            )
            for rank, (_, writer) in enumerate(pipes)
        ]
        for sender in senders:
            sender.start()
        return process_context, senders


def _join_collecting(process_context: ProcessContext, channels: _SpawnChannels) -> _SpawnOutcome:
    """Wait for the spawned processes while reading what rank 0 sends.

    The results are read while waiting, not after: a result larger than the pipe's buffer
    blocks its sender until someone reads it, and the sender could never exit.
    """
    outcome: _SpawnOutcome | None = None
    try:
        done = False
        while not done:
            # On a failure, join() ends the other processes (SIGTERM, then SIGKILL) and raises.
            done = process_context.join(timeout=_CHILD_POLL_S, grace_period=_TERMINATE_GRACE_S)
            while not channels.results.empty():
                outcome = pickle.loads(channels.results.get())
    except (ProcessRaisedException, ProcessExitedException) as error:
        failures: list[_SpawnFailure] = []
        while not channels.failures.empty():
            failures.append(channels.failures.get())
        raise _spawn_failure_error(error, failures) from error
    except BaseException:  # KeyboardInterrupt while waiting: do not leave the processes behind
        _end_spawned(process_context)
        raise
    if outcome is None:
        raise ProcessFailedError(
            "Spawned local rank 0 exited with code 0 without sending back its result; something in the"
            " launched function ended the process early (sys.exit(0) or os._exit(0))."
        )
    return outcome


def _spawn_failure_error(
    error: ProcessRaisedException | ProcessExitedException, failures: list[_SpawnFailure]
) -> ProcessFailedError:
    if not failures:
        return ProcessFailedError(
            f"Spawned local rank {error.error_index} (pid {error.error_pid}) failed, so the others were"
            f" stopped: {error}"
        )
    first, *others = failures
    then = "".join(f", then local rank {other.local_rank}" for other in others)
    message = (
        f"Spawned local rank {first.local_rank} failed first{then}; the other processes were stopped."
        f" What local rank {first.local_rank} reported:\n{first.report}"
    )
    if isinstance(error, ProcessExitedException):  # a process died without a Python exception
        message += f"\nAlso: local rank {error.error_index} (pid {error.error_pid}): {error}"
    return ProcessFailedError(message)


def _end_spawned(process_context: ProcessContext) -> None:
    processes = process_context.processes
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + _TERMINATE_GRACE_S
    for process in processes:
        process.join(max(deadline - time.monotonic(), 0.0))
        if process.is_alive():
            process.kill()
            process.join()
