"""How a multi-process job ends: a finished job exits 0 every time, and a copy of the program that
SubprocessScriptLauncher starts ends with the status ``python`` would have given it
(fullshard.launch.rerun_main, [Note: a launched copy leaves with os._exit]).

Run: pytest tests/test_teardown.py  (add -m "not multiprocess" for the fast tests only)
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fullshard.launch.launchers import RERUN_MAIN
from fullshard.launch.rerun_main import DIE_BY_SIGINT, exit_status

# ---------------------------------------------------------------------------------------------
# exit_status: python's rules for the status of a program that ended


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (None, 0),
        (SystemExit(), 0),
        (SystemExit(None), 0),
        (SystemExit(0), 0),
        (SystemExit(3), 3),
        (SystemExit(True), 1),
        (SystemExit(-1), 255),
        (SystemExit(256 + 7), 7),
        (SystemExit(2**70), 255),  # beyond a C long: python exits with -1
        (ValueError("boom"), 1),
        (KeyboardInterrupt(), DIE_BY_SIGINT),
    ],
)
def test_exit_status_follows_python(error: BaseException | None, status: int) -> None:
    assert exit_status(error) == status


def test_exit_status_prints_a_message_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_status(SystemExit("stopping: no data")) == 1
    assert capsys.readouterr().err == "stopping: no data\n"


# ---------------------------------------------------------------------------------------------
# rerun_main runs a program as python does (no torch here: these take milliseconds)

_PROGRAMS = {
    "returns": """
        import os, sys
        print(__name__, sys.argv[1:], __file__ == os.path.abspath(sys.argv[0]))
        print(sys.path[0] == os.path.dirname(os.path.realpath(__file__)), __spec__, __package__)
    """,
    "sys_exit": "import sys; print('leaving'); sys.exit(3)",
    "raise_system_exit": "raise SystemExit(-1)",
    "exit_message": "import sys; sys.exit('stopping: no data')",
    "uncaught": """
        def fail():
            raise ValueError("boom")
        fail()
    """,
    "keyboard_interrupt": "raise KeyboardInterrupt",
    "threads_then_atexit": """
        import atexit, threading, time
        atexit.register(print, "atexit ran")
        threading.Thread(target=lambda: (time.sleep(0.2), print("thread done"))).start()
    """,
    "unclosed_file": """
        import sys
        out = open(sys.argv[1], "w")
        out.write("kept without close")
    """,
}


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=cwd, timeout=60, check=False
    )


@pytest.mark.parametrize("name", sorted(_PROGRAMS))
def test_rerun_main_ends_a_program_as_python_does(name: str, tmp_path: Path) -> None:
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(_PROGRAMS[name]))
    out = tmp_path / "out.txt"
    natively = _run([str(script), str(out)], tmp_path)
    out.unlink(missing_ok=True)
    rerun = _run([RERUN_MAIN, str(script), str(out)], tmp_path)
    assert (rerun.returncode, rerun.stdout, rerun.stderr) == (
        natively.returncode,
        natively.stdout,
        natively.stderr,
    )
    if name == "unclosed_file":  # finalization would have flushed it; os._exit alone would not
        assert out.read_text() == "kept without close"
    if name == "keyboard_interrupt":
        assert rerun.returncode == -signal.SIGINT


def test_rerun_main_runs_a_module_as_python_m_does(tmp_path: Path) -> None:
    package = tmp_path / "tool"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(
        "import sys\nprint(__name__, __spec__.name, sys.argv, sys.path[0])\nsys.exit(4)\n"
    )
    natively = _run(["-m", "tool", "--flag"], tmp_path)
    rerun = _run([RERUN_MAIN, "-m", "tool", "--flag"], tmp_path)
    assert natively.returncode == 4
    assert (rerun.returncode, rerun.stdout, rerun.stderr) == (natively.returncode, natively.stdout, "")


# ---------------------------------------------------------------------------------------------
# Real two-process jobs: each must exit 0, every time


def _check_exit_0(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "terminate called" not in result.stderr, result.stderr


@pytest.mark.multiprocess
def test_a_late_gloo_release_does_not_abort_a_launched_copy() -> None:
    # Deterministic form of the rare crash: before rank 1 left with os._exit, this job ended
    # with "terminate called without an active exception" (exit 134) in 6 runs of 6.
    from conftest import run_script

    for _ in range(2):
        result = run_script("teardown_job.py", timeout=120, fresh_python=True)
        _check_exit_0(result)
        assert "teardown-job rank=1 ends" in result.stdout


@pytest.mark.multiprocess
def test_a_finished_ddp_fit_exits_0_every_time() -> None:
    # The job that once ended with SIGABRT in rank 1 after both ranks printed "done".
    from conftest import run_script

    for _ in range(3):
        result = run_script("launch_warnings.py", timeout=120, fresh_python=True)
        _check_exit_0(result)
        assert "rank 0 done" in result.stdout and "rank 1 done" in result.stdout
