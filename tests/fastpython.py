"""``python SCRIPT ARGS`` through the tests' fork server; see [Note: the fork server] in
tests/forkserver.py. Copied next to the server's socket behind a ``#!<python> -IS`` line.

It sends the server its argv, environment, working directory and stdin/stdout/stderr, forwards
the signals it gets to the job, and exits with the job's status (dying by the same signal). For
any other argv (``-m``, ``-c``, options), open file descriptors besides 0-2 (a pipe passed to a
worker), a server that cannot be reached or declines, it execs the real python instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import socket
import struct
import sys
from typing import NoReturn

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
_pending: list[int] = []  # signals received before the job runs
_job: socket.socket | None = None


def real_python() -> NoReturn:
    for signum in _pending:  # not delivered to a job: to the python that runs it instead
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])


def _only_stdio() -> bool:
    """Whether fds 0-2 are open and no other is (the server can hand a job only those three)."""
    open_fds = set()
    for entry in os.listdir("/proc/self/fd"):  # lists its own fd too, closed by now
        try:
            os.fstat(int(entry))
        except OSError:
            continue
        open_fds.add(int(entry))
    return open_fds == {0, 1, 2}


def _forward(signum: int, frame: object) -> None:
    if _job is None:
        _pending.append(signum)
    else:
        with contextlib.suppress(OSError):  # the server is gone; so is the job
            _job.send(bytes([signum]))


def _read(conn: socket.socket, size: int) -> bytes:
    """``size`` bytes, or fewer if the server went away."""
    data = b""
    with contextlib.suppress(OSError):
        while len(data) < size and (chunk := conn.recv(size - len(data))):
            data += chunk
    return data


def _exit_as(status: int) -> NoReturn:
    """Exit as the job did: with its code, or killed by its signal (a parent sees the same)."""
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
        if signum not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)
    os._exit(os.waitstatus_to_exitcode(status))


def main() -> NoReturn:
    global _job
    script = sys.argv[1] if len(sys.argv) > 1 else "-"
    if script.startswith("-") or script.endswith((".zip", ".pyz")) or not os.path.isfile(script):
        real_python()
    if not _only_stdio():
        real_python()
    for signum in FORWARDED:
        signal.signal(signum, _forward)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    umask = os.umask(0)
    os.umask(umask)
    try:
        conn.connect(os.path.join(os.path.dirname(os.path.abspath(__file__)), "socket"))
        request = {
            "argv": sys.argv[1:],
            "env": dict(os.environ),
            "cwd": os.getcwd(),
            "umask": umask,
            "pid": os.getpid(),
        }
        data = json.dumps(request).encode()
        socket.send_fds(conn, [struct.pack("!I", len(data))], [0, 1, 2])
        conn.sendall(data)
        if _read(conn, 1) != b"R":  # declined ("F"), or the server ended before starting it
            real_python()
    except OSError:
        real_python()
    _job = conn
    for signum in _pending:
        _forward(signum, None)
    _pending.clear()
    status = _read(conn, 4)
    if len(status) != 4:
        print("fastpython: the fork server ended while the job ran", file=sys.stderr)
        os._exit(1)
    _exit_as(struct.unpack("!i", status)[0])


main()
