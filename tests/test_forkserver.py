"""The fork server the tests run scripts with ([Note: the fork server] in forkserver.py): a job
cannot be told apart from ``python SCRIPT ARGS``, and never outlives its client."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import forkserver
from conftest import SCRIPTS

pytestmark = pytest.mark.skipif(
    os.environ.get(forkserver.DISABLE_VAR) == "0", reason="FULLSHARD_TEST_FORKSERVER=0: no fork server"
)


def _run(
    python: str, script: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, str(script), *args], capture_output=True, text=True, timeout=120, env=env)


def _both(
    script: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """The script run as a fork server job and by a real python."""
    return _run(forkserver.python(), script, *args, env=env), _run(sys.executable, script, *args, env=env)


def _state(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.returncode == 0, result.stderr
    state: dict[str, Any] = json.loads(result.stdout)
    return state


@pytest.mark.parametrize(
    "env",
    [
        {"PYTHONWARNINGS": "", "PYTHONUNBUFFERED": "0"},  # both as if unset
        {
            "PYTHONWARNINGS": "error::ResourceWarning,ignore",
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            "PYTHONDONTWRITEBYTECODE": "x",
        },
    ],
    ids=["defaults", "options"],
)
def test_a_job_starts_as_python_would(tmp_path: Path, env: dict[str, str]) -> None:
    env = {**{k: v for k, v in os.environ.items() if k not in forkserver._REDONE}, **env}
    forked, real = _both(SCRIPTS / "startup_state.py", *forkserver.PRELOAD, env=env)
    forked_state, real_state = _state(forked), _state(real)
    assert forked_state.pop("random") != real_state.pop("random")
    assert forked_state == real_state


def test_sys_executable_is_the_client_and_torch_is_already_imported(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text("import sys\nprint(sys.executable, 'torch' in sys.modules)\n")
    assert _run(forkserver.python(), script).stdout.split() == [forkserver.python(), "True"]
    spawn = tmp_path / "spawn.py"  # multiprocessing's spawned processes: a real python
    spawn.write_text("import os, multiprocessing.spawn as s\nprint(os.fsdecode(s.get_executable()))\n")
    assert _run(forkserver.python(), spawn).stdout.strip() == sys.executable
    # any other command line, or an environment the imports would have read otherwise: real python
    other = subprocess.run(
        [forkserver.python(), "-c", "import sys; print(sys.executable)"], capture_output=True, text=True
    )
    assert other.stdout.strip() == sys.executable
    declined = _run(forkserver.python(), script, env={**os.environ, "TORCH_FORKSERVER_TEST": "1"})
    assert declined.stdout.split() == [sys.executable, "False"]
    read, write = os.pipe()  # a descriptor passed on, as to inductor's compile workers
    passed = subprocess.run(
        [forkserver.python(), str(script)], pass_fds=[write], capture_output=True, text=True
    )
    os.close(read)
    os.close(write)
    assert passed.stdout.split() == [sys.executable, "False"]


@pytest.mark.parametrize(
    "code",
    [
        "import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)\n",
        "raise ValueError('boom')\n",
        "def f():\n    raise KeyboardInterrupt\nf()\n",
        "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n",
        "import sys\nsys.exit('a message')\n",
    ],
    ids=["exit-code", "exception", "keyboard-interrupt", "signal", "exit-message"],
)
def test_output_and_status_are_pythons(tmp_path: Path, code: str) -> None:
    script = tmp_path / "job.py"
    script.write_text(code)
    forked, real = _both(script)
    assert (forked.returncode, forked.stdout, forked.stderr) == (real.returncode, real.stdout, real.stderr)


def test_a_warning_is_printed_by_every_job(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(
        "import warnings, torch\n"
        "warnings.warn('from the script')\n"
        "torch.tensor(torch.ones(1))  # a warning from torch's C++ code\n"
    )
    for _ in range(2):
        stderr = _run(forkserver.python(), script).stderr
        assert "UserWarning: from the script" in stderr and "UserWarning: To copy construct" in stderr


def _start(script: Path) -> tuple[subprocess.Popen[str], int]:
    """A client whose job prints its pid and then waits for a signal."""
    client = subprocess.Popen([forkserver.python(), str(script)], stdout=subprocess.PIPE, text=True)
    assert client.stdout is not None
    return client, int(client.stdout.readline())


def test_signals_reach_the_job(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGUSR1, lambda *_: sys.exit(7))\n"
        "print(os.getpid(), flush=True)\n"
        "time.sleep(60)\n"
    )
    client, _ = _start(script)
    client.send_signal(signal.SIGUSR1)
    assert client.wait(timeout=30) == 7
    client, _ = _start(script)
    client.terminate()
    assert client.wait(timeout=30) == -signal.SIGTERM  # the job died by it: so does the client


def test_a_killed_client_leaves_no_job_behind(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text("import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(60)\n")
    client, job = _start(script)
    assert job != client.pid and _running(job)
    client.kill()
    client.wait()
    deadline = time.monotonic() + 10
    while _running(job) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(job)


_TWO_RANKS = """
import os, time, torch, fullshard
from torch.utils.data import DataLoader, TensorDataset

class Slow(fullshard.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        print(self.trainer.global_rank, os.getpid(), flush=True)
        time.sleep(60)  # out of any collective: only the watch on its launcher can end rank 1
        return self.net(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

trainer = fullshard.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=1000, logger=False,
    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Slow(), DataLoader(TensorDataset(torch.ones(2000, 2)), batch_size=1))
"""


def test_a_killed_client_of_a_launched_job_leaves_no_rank_behind(tmp_path: Path) -> None:
    """Rank 1 is a client too, started by rank 0's job: when rank 0's client is SIGKILLed, the
    server ends rank 0's job, and rank 1's job (asleep, in no collective) ends as a real python
    does: the launcher's watchdog compares os.getppid(), which a job reports as its client's."""
    script = tmp_path / "two_ranks.py"
    script.write_text(_TWO_RANKS)
    client = subprocess.Popen([forkserver.python(), str(script)], stdout=subprocess.PIPE, text=True)
    assert client.stdout is not None
    jobs: dict[str, str] = {}  # rank -> pid
    while len(jobs) < 2:
        line = client.stdout.readline()
        if re.fullmatch(r"[01] \d+\n", line):
            jobs.setdefault(*line.split())
    client.kill()
    client.wait()

    def left() -> list[str]:
        clients = [
            p.name
            for p in Path("/proc").iterdir()
            if p.name.isdigit() and str(script).encode() in _cmdline(p)
        ]
        return [pid for pid in [*jobs.values(), *clients] if _running(int(pid))]

    deadline = time.monotonic() + 15
    while left() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left()


def _cmdline(process: Path) -> bytes:
    try:
        return (process / "cmdline").read_bytes()
    except OSError:
        return b""


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie may wait for an init that reaps late)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
