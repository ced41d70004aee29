"""Start several process trees (torchrun agents, hand-started ranks) for a test, wait for them,
and leave none behind.

torchrun starts its workers in sessions of their own, so killing the agent's process group does
not reach them: :class:`Processes` kills every descendant it finds under ``/proc`` as well.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

_CLEARED_PREFIXES = ("SLURM_", "TORCHELASTIC_", "FULLSHARD_", "PET_")
_CLEARED = {"LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE",
            "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"}  # fmt: skip


def free_port() -> int:
    """A TCP port that is free on the loopback interface right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without cluster variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in _CLEARED and not k.startswith(_CLEARED_PREFIXES)}
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def torchrun(*args: str) -> list[str]:
    """The command line of ``torchrun ARGS`` with this interpreter."""
    return [sys.executable, "-m", "torch.distributed.run", *args]


def _stat(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (field 4, the parent id, is [1])."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()  # the name in parentheses may hold spaces


def _identity(pid: int) -> tuple[int, str] | None:
    """A pid with its start time, so that a pid the system reused is not taken for the process."""
    fields = _stat(pid)
    return (pid, fields[19]) if fields is not None else None


def descendants(pid: int) -> list[tuple[int, str]]:
    """Every process below ``pid`` (children, grandchildren, ...), with its start time."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(int(entry))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[tuple[int, str]] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if (identity := _identity(child)) is not None:
                found.append(identity)
            todo.append(child)
    return found


class Processes:
    """Process trees started for one test; on exit every one still running is killed.

    Each is started in a session of its own with its output in ``<logs>/<name>.log``.
    """

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, cmd: Sequence[str], env: Mapping[str, str], cwd: Path | None = None) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"{name}.log", "wb") as log:
            self.procs[name] = subprocess.Popen(
                list(cmd),
                env=dict(env),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=cwd,
            )

    def wait(self, timeout: float, *names: str) -> dict[str, int]:
        """Exit codes by name (of ``names``, by default of all); fails the test (with every log)
        when one runs past ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        codes: dict[str, int] = {}
        for name in names or self.procs:
            try:
                codes[name] = self.procs[name].wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{name} still ran after {timeout} s\n{self.output()}") from None
        return codes

    def output(self, name: str | None = None) -> str:
        names = [name] if name is not None else list(self.procs)
        return "\n".join(
            f"----- {n}.log\n{(self.logs / f'{n}.log').read_text(errors='replace')}" for n in names
        )

    def check_ok(self, timeout: float, *names: str) -> None:
        """Wait as :meth:`wait` does; fail the test when one exits non-zero."""
        codes = self.wait(timeout, *names)
        failed = {name: code for name, code in codes.items() if code != 0}
        assert not failed, f"exit codes {failed}\n{self.output()}"

    def __enter__(self) -> Processes:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.kill()

    def kill(self) -> None:
        """SIGTERM the processes still running (torchrun stops its workers on it), then SIGKILL
        them and every descendant a few seconds later."""
        running = [p for p in self.procs.values() if p.poll() is None]
        if not running:
            return
        below = {p.pid: descendants(p.pid) for p in running}  # torchrun's workers outlive a killed agent
        for proc in running:
            _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(deadline - time.monotonic(), 0.1))
        for proc in running:
            others = below[proc.pid]
            if proc.poll() is None:  # not reaped yet, so its pid is still ours
                others += descendants(proc.pid)
                _signal_group(proc.pid, signal.SIGKILL)
            for pid, started in others:
                if _identity(pid) == (pid, started):
                    _signal_group(pid, signal.SIGKILL)
            proc.wait()


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)  # every process we start leads a session (and so a group) of its own
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
