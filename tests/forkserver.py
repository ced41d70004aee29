"""A fork server for the Python processes the tests start: each starts with torch and fullshard
already imported.

[Note: the fork server]
Starting ``python`` and importing torch (FSDP, DCP, dynamo) and fullshard costs seconds of CPU in
every process a test starts: each test script, and each rank its Trainer launches. This server
(``python tests/forkserver.py DIR``, one per pytest session, started on first use by
:func:`python`) imports all that once and then forks a fresh child per request. The client,
``DIR/python`` (tests/fastpython.py behind a ``#!<python> -IS`` line), stands in for ``python
SCRIPT ARGS``: it hands the server its argv, environment, working directory and stdin/stdout/
stderr, forwards the signals it gets and exits as the job did. In a job ``sys.executable`` is
the client, so the ranks the launcher starts go through the server too.

A job must not be told apart from ``python SCRIPT ARGS``. The child redoes what python does at
start from the environment (warning filters from PYTHONWARNINGS, stdio buffering, bytecode
writing, OMP_NUM_THREADS), gets fresh warning registries, new random seeds and a fresh
``__main__``, and runs the script and leaves as python would (fullshard.launch.rerun_main's
functions; ``rerun_main.py ...`` itself runs as a script, so its os._exit ending is kept). What
the imports read from the environment is recorded, and a request whose environment differs there
(or in variables C libraries read at load) is answered "run it yourself": the client then execs
the real python, as it does for any other argv (``-m``, ``-c``, options), with descriptors open
besides 0-2, or when the server cannot be reached. A job's ``os.getppid()`` is its client's
parent's (the launcher's watchdog in a rank compares it), and no job outlives its client.

What a job still shows: the str hash seed is the server's (the same in every job); values an
import derived from ``sys.argv``; ``sys.flags`` (``sys.dont_write_bytecode`` is redone);
``gc.get_objects()`` leaves out the preloaded objects (frozen, see main()); its pid is not the
client's (Popen.pid), and /proc shows the server's command line. DIR/server.log: a line per job.

FULLSHARD_TEST_FORKSERVER=0 turns it off (every process is a real ``python``).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import io
import json
import logging
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

DISABLE_VAR = "FULLSHARD_TEST_FORKSERVER"
SOCKET_NAME = "socket"  # DIR/socket; the client finds it next to itself
CLIENT_NAME = "python"

# What a typical test script imports (measured: torch 3 s, FSDP with dynamo 2 s, DCP, fullshard).
PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.distributed.fsdp",
    "torch.distributed.fsdp.wrap",
    "torch.distributed.checkpoint",
    "torch.distributed.checkpoint.state_dict",
    "torch.distributed.tensor",
    "torch.distributed.algorithms.ddp_comm_hooks",
    "torch.nn.parallel",
    "torch.utils.data",
    "torch._dynamo",  # the first optimizer a process builds imports it
    "numpy.random",
    "multiprocessing.spawn",  # caches sys.executable: spawned processes keep the real python
    "fullshard",
    "fullshard.strategies",
    "fullshard.checkpoint.async_save",
    "fullshard.checkpoint.dcp_reading",
    "fullshard.checkpoint.engine",
    "fullshard.checkpoint.validate",
    "fullshard.launch.rerun_main",
)
# Redone in each job from its own environment (so the server starts without them).
_REDONE = {
    "PYTHONWARNINGS",
    "PYTHONUNBUFFERED",
    "PYTHONDONTWRITEBYTECODE",
    "OMP_NUM_THREADS",
    "PYTHONBREAKPOINT",
}
# Read when the interpreter or a C library starts (getenv, which the recording below cannot see).
_READ_AT_LOAD = ("PYTHON", "TORCH", "PYTORCH", "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "LD_", "LC_", "LANG", "CUDA", "MALLOC_", "TQDM_")  # fmt: skip


# ---------------------------------------------------------------------------------------------
# The pytest side: start the server on first use, stop it at the end of the session.

_server: subprocess.Popen[bytes] | None = None
_directory = ""
# The server gets the environment pytest started with, not one a test changed before it asked.
_SESSION_ENV = dict(os.environ)


def python() -> str:
    """The ``python`` to run a test script with: the fork server's client (the server starts
    now if it runs not yet), or ``sys.executable`` with FULLSHARD_TEST_FORKSERVER=0."""
    global _server, _directory
    if os.environ.get(DISABLE_VAR) == "0" or not _usable():
        return sys.executable
    if _server is None:
        _directory = tempfile.mkdtemp(prefix="fullshard-forkserver-")
        client = Path(_directory, CLIENT_NAME)
        # -I -S: the client starts in 20 ms (no site-packages, no PYTHON* variables).
        source = Path(__file__).with_name("fastpython.py").read_text()
        client.write_text(f"#!{sys.executable} -IS\n{source}")
        client.chmod(0o755)
        env = {k: v for k, v in _SESSION_ENV.items() if k not in _REDONE}
        with open(Path(_directory, "server.log"), "wb") as log:
            # A session of its own: a Ctrl-C in the terminal reaches the clients, which forward it.
            _server = subprocess.Popen(
                [sys.executable, __file__, _directory],
                stdin=subprocess.PIPE,  # closed by stop(), or when pytest dies: the server ends
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + 30
        while (
            not Path(_directory, SOCKET_NAME).exists()
            and _server.poll() is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.01)  # bound at once, before the imports: a client cannot come too early
    return str(Path(_directory, CLIENT_NAME))


def _usable() -> bool:
    """Linux (/proc, pidfds), an interpreter path a ``#!`` line can hold, an executable /tmp."""
    noexec = os.statvfs(tempfile.gettempdir()).f_flag & os.ST_NOEXEC
    return sys.platform == "linux" and " " not in sys.executable and not noexec


def stop() -> None:
    """End the server (and any job still running) if it was started."""
    global _server
    if _server is None:
        return
    assert _server.stdin is not None
    _server.stdin.close()
    try:
        _server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        _server.kill()
        _server.wait()
    shutil.rmtree(_directory, ignore_errors=True)
    _server = None


# ---------------------------------------------------------------------------------------------
# The server.


@dataclass
class _Preloaded:
    """What importing PRELOAD did that a job must see as its own import's doing."""

    env_before: dict[str, str]
    env_after: dict[str, str]
    env_read: set[str] = field(default_factory=set)
    filters_start: list[Any] = field(default_factory=list)  # what python starts with
    filters_front: list[Any] = field(default_factory=list)  # added by the imports, ahead of them
    filters_tail: list[Any] = field(default_factory=list)  # appended by the imports


def _preload() -> _Preloaded:
    environ_type = type(os.environ)
    getitem = environ_type.__getitem__
    done = _Preloaded(env_before=dict(os.environ), env_after={}, filters_start=list(warnings.filters))

    def recording(self: Any, key: str) -> Any:
        # get / in / [] are reads; a copy or a scan of the whole environment (tqdm's TQDM_*) is not
        if sys._getframe(1).f_code.co_name not in ("__iter__", "copy"):
            done.env_read.add(key)
        return getitem(self, key)

    environ_type.__getitem__ = recording  # type: ignore[method-assign]
    try:
        for name in PRELOAD:
            importlib.import_module(name)
    finally:
        environ_type.__getitem__ = getitem  # type: ignore[method-assign]
    done.env_after = dict(os.environ)  # importing torch._dynamo sets TORCHINDUCTOR_CACHE_DIR
    after, start = list(warnings.filters), done.filters_start
    at = next((i for i in range(len(after) - len(start) + 1) if after[i : i + len(start)] == start), None)
    if at is None:
        sys.exit("fork server: the imports removed warning filters python starts with")
    done.filters_front, done.filters_tail = after[:at], after[at + len(start) :]
    return done


def _fits(env: dict[str, str], done: _Preloaded) -> bool:
    """Whether a fresh python with ``env`` would have imported PRELOAD exactly as the server did."""
    threads = env.get("OMP_NUM_THREADS")
    if threads is not None and not (threads.isdigit() and int(threads) > 0):
        return False  # left to libgomp's own parsing, in a real python
    keys = done.env_read | {k for k in [*env, *done.env_before] if k.startswith(_READ_AT_LOAD)}
    for key in keys - _REDONE:
        before, after, value = done.env_before.get(key), done.env_after.get(key), env.get(key)
        if value != before and not (before != after and value == after):
            return False
    return True


@dataclass
class _Job:
    pid: int
    pidfd: int  # readable once the job exited: no SIGCHLD handler, no polling
    conn: socket.socket | None  # None once the client is gone
    argv: list[str]


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """A request: a 4-byte length with the client's stdin/stdout/stderr, then that much JSON."""
    header, fds, _, _ = socket.recv_fds(conn, 4, 3)
    if len(header) != 4 or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        raise ValueError("a malformed request")
    (size,) = struct.unpack("!I", header)
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ValueError("a truncated request")
        data += chunk
    return json.loads(data), fds


def _serve(listener: socket.socket, done: _Preloaded) -> tuple[dict[str, Any], list[int]]:
    """Fork a job per request until stdin closes; returns only in a job: its request and fds.

    One thread: forking is safe, children are watched through pidfds, and each client's
    connection carries the signals it forwards; it closing while its job runs (the client was
    killed) SIGKILLs the job, so that no job outlives its client.
    """
    jobs: dict[int, _Job] = {}  # by pidfd
    server = os.getpid()
    while True:
        conns = {job.conn: job for job in jobs.values() if job.conn is not None}
        ready, _, _ = select.select([0, listener, *conns, *jobs], [], [])
        for item in ready:
            if item == 0 and not os.read(0, 1024):  # pytest stopped us, or is gone
                for job in jobs.values():
                    os.kill(job.pid, signal.SIGKILL)
                os._exit(0)
            elif item is listener:
                conn, _ = listener.accept()
                conn.settimeout(10)
                try:
                    request, fds = _receive(conn)
                except (OSError, ValueError):
                    conn.close()
                    continue
                if not _fits(request["env"], done):
                    for fd in fds:
                        os.close(fd)
                    with contextlib.suppress(OSError):
                        conn.sendall(b"F")
                    conn.close()
                    continue
                gc.freeze()  # see main()
                pid = os.fork()
                if pid == 0:
                    gc.enable()
                    _die_with(server)
                    for other in [listener, conn, *conns]:
                        other.close()
                    for pidfd in jobs:
                        os.close(pidfd)
                    return request, fds
                for fd in fds:  # the client's pipes must close when the job and client are done
                    os.close(fd)
                job = _Job(pid, os.pidfd_open(pid), conn, request["argv"])
                jobs[job.pidfd] = job
                try:
                    conn.sendall(b"R")
                except OSError:
                    os.kill(pid, signal.SIGKILL)
                    job.conn = None
            elif item in conns and conns[item].conn is item:  # not closed by a reap just above
                job = conns[item]
                try:
                    forwarded = item.recv(64)
                except OSError:
                    forwarded = b""
                if not forwarded:  # the client is gone (not reaped yet, so the pid is still the job's)
                    os.kill(job.pid, signal.SIGKILL)
                    item.close()
                    job.conn = None
                for signum in forwarded:
                    os.kill(job.pid, signum)
            elif item in jobs:
                job = jobs.pop(item)
                os.close(job.pidfd)
                _, status, usage = os.wait4(job.pid, 0)
                print(
                    f"job {job.pid} status {status} cpu {usage.ru_utime + usage.ru_stime:.2f}s {job.argv}",
                    flush=True,
                )
                if job.conn is not None:
                    with contextlib.suppress(OSError):
                        job.conn.sendall(struct.pack("!i", status))
                    job.conn.close()
                    job.conn = None


def _check_forkable() -> None:
    """Fork once and wait: numpy's OpenBLAS stops its thread pool before a fork (pthread_atfork)
    and starts it again only when used, so the server is single-threaded from then on. A CUDA
    driver initialized by the imports would fail in every child: refuse both (clients fall back)."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.close(os.pidfd_open(pid))  # Linux 5.3: checked before a job depends on it
    os.waitpid(pid, 0)
    threads = os.listdir("/proc/self/task")
    if len(threads) != 1:
        sys.exit(f"fork server: {len(threads)} threads after the imports; not forking from that")
    if "libcuda.so" in Path("/proc/self/maps").read_text():
        sys.exit("fork server: the imports initialized the CUDA driver, which a forked child cannot use")


def _die_with(server: int) -> None:
    """SIGKILL this job if the server ends (it kills its jobs itself, unless it crashed): no job
    outlives both its client and the server. Not inherited by the job's own children."""
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != server:  # it ended before that
        os._exit(1)


# ---------------------------------------------------------------------------------------------
# A job: become the process ``python SCRIPT ARGS`` would have started, and run it.


def _env_flag(env: dict[str, str], name: str) -> bool:
    """Whether python counts variable ``name`` as set (a number counts when not 0)."""
    value = env.get(name, "")
    try:
        return int(value) != 0
    except ValueError:
        return bool(value)


def _open_stdio(unbuffered: bool) -> None:
    """New sys.stdin/stdout/stderr on fds 0-2, made as python makes them at start (create_stdio)."""
    old_streams = []
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        old = getattr(sys, f"__{name}__")
        write = fd > 0
        mode, buffering = ("wb", 0 if unbuffered else -1) if write else ("rb", -1)
        buffer: Any = open(fd, mode, buffering=buffering, closefd=False)  # noqa: SIM115  # sys.stdin/out/err
        raw = buffer if isinstance(buffer, io.FileIO) else buffer.raw
        raw.name = f"<{name}>"
        line_buffering = not unbuffered and (raw.isatty() or fd == 2)
        stream = io.TextIOWrapper(buffer, old.encoding, old.errors, "\n", line_buffering, unbuffered)
        stream.mode = "w" if write else "r"  # type: ignore[misc]
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
        old_streams.append((old, stream))
    # torch's logger got a handler on the server's stderr at import: it writes to the new one
    for logger in [logging.root, *logging.Logger.manager.loggerDict.values()]:
        for handler in getattr(logger, "handlers", []):
            for old, stream in old_streams:
                if isinstance(handler, logging.StreamHandler) and handler.stream is old:
                    handler.setStream(stream)
    if unbuffered:  # python -u makes C stdio unbuffered too (output of torch's C++ code)
        import ctypes

        libc = ctypes.CDLL(None)
        for name in ("stdin", "stdout", "stderr"):
            libc.setvbuf(ctypes.c_void_p.in_dll(libc, name), None, 2, 0)  # _IONBF


def _fresh_warnings(env: dict[str, str], done: _Preloaded) -> None:
    """Filters as python sets them from PYTHONWARNINGS, with the imports' own ahead of them (as
    they were added after), and no warning remembered as already shown."""
    options = [option for option in env.get("PYTHONWARNINGS", "").split(",") if option]
    sys.warnoptions[:] = options
    warnings.filters[:] = done.filters_start
    warnings._filters_mutated()  # type: ignore[attr-defined]
    warnings._processoptions(options)  # type: ignore[attr-defined]  # python's own start-up code
    warnings.filters[:0] = done.filters_front
    warnings.filters.extend(done.filters_tail)
    warnings._filters_mutated()  # type: ignore[attr-defined]
    warnings.onceregistry.clear()  # type: ignore[attr-defined]
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if isinstance(namespace, dict):  # not the mappingproxy of a class posing as a module
            namespace.pop("__warningregistry__", None)


def _become(request: dict[str, Any], fds: list[int], done: _Preloaded, client: str) -> None:
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    env: dict[str, str] = request["env"]
    for key in done.env_before.keys() | done.env_after.keys():  # what the imports set, as they would have
        before, after = done.env_before.get(key), done.env_after.get(key)
        if before != after and env.get(key) == before:
            if after is None:
                del env[key]
            else:
                env[key] = after
    os.environ.clear()
    os.environ.update(env)
    _open_stdio(_env_flag(env, "PYTHONUNBUFFERED"))
    _fresh_warnings(env, done)
    sys.dont_write_bytecode = _env_flag(env, "PYTHONDONTWRITEBYTECODE")
    if "OMP_NUM_THREADS" in env:  # libgomp read it when the server loaded it
        import torch

        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    import numpy.random  # python's own random module reseeds itself in a forked child

    numpy.random.seed()
    sys.executable = client
    sys.orig_argv = [client, *request["argv"]]
    client_pid = request["pid"]

    def getppid() -> int:
        """The client's parent: the job stands in for the client, whose parent may watch it
        (fullshard's launched ranks end when the launcher is gone; they compare os.getppid())."""
        try:
            return int(Path(f"/proc/{client_pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            return 1  # the client is gone (the server is SIGKILLing this job)

    os.getppid = getppid


def _run(argv: list[str]) -> NoReturn:
    """Run ``SCRIPT ARGS`` and end as ``python SCRIPT ARGS`` would: the traceback, then the
    interpreter's own finalization (threads, atexit) with the status."""
    from fullshard.launch import rerun_main

    error: BaseException | None = None
    try:
        rerun_main.run_program(argv)
    except BaseException as caught:
        error = caught
    if error is not None:
        assert error.__traceback__ is not None
        rerun_main.report_uncaught(error.with_traceback(error.__traceback__.tb_next), rerun_main.__file__)
    status = rerun_main.exit_status(error)
    if status == rerun_main.DIE_BY_SIGINT:
        sys.excepthook = lambda *args: None  # printed above; uncaught, python dies by SIGINT at exit
        raise error  # type: ignore[misc]
    sys.exit(status)


def main(directory: str) -> NoReturn:
    del sys.path[0]  # this file's directory: a job's script puts its own there
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.path.join(directory, SOCKET_NAME))
    listener.listen(64)  # bound before the imports: clients wait in the backlog meanwhile
    # The collector must not touch the preloaded objects in a job: that writes to each one's
    # header, copying every page of the server's memory, and takes a second at exit (measured).
    # Disabled here so the imports leave no holes in the pages; frozen before each fork.
    gc.disable()
    done = _preload()
    _check_forkable()
    request, fds = _serve(listener, done)
    _become(request, fds, done, os.path.join(directory, CLIENT_NAME))
    _run(request["argv"])


if __name__ == "__main__":
    main(sys.argv[1])
