"""Shared test fixtures: fail a test that leaks environment variables or a live process group; run
the comparisons with Lightning only where its environment is (tests/lightning_env.py); under CI,
fail the run when a test was skipped for any reason but a missing GPU."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

import forkserver
import lightning_env

SCRIPTS = Path(__file__).parent / "scripts"
_WATCHED_ENV = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("lightning") is not None:
        lightning_env.require()


_SKIPPED: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Under CI (``CI`` set, as .ci/run does) a skip hides what did not run: only tests marked
    ``gpu`` may skip there (CI has no GPU). Collected where results arrive (pytest-xdist's
    controller gets every worker's reports)."""
    if not os.environ.get("CI") or not report.skipped or hasattr(report, "wasxfail"):
        return
    if "gpu" in report.keywords:
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    _SKIPPED.append(f"{report.nodeid}: {reason}")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _SKIPPED and not hasattr(session.config, "workerinput") and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _SKIPPED:
        terminalreporter.section("skipped under CI (only tests marked gpu may skip there)", red=True)
        for line in _SKIPPED:
            terminalreporter.line(line)


@pytest.fixture(scope="session", autouse=True)
def _forkserver() -> Iterator[None]:
    """Stop the fork server at the end of the session (it starts on first use)."""
    yield
    forkserver.stop()


@pytest.fixture(autouse=True)
def _no_leaks() -> Iterator[None]:
    before = {k: os.environ.get(k) for k in _WATCHED_ENV}
    yield
    leaked = {k: os.environ.get(k) for k in _WATCHED_ENV if os.environ.get(k) != before[k]}
    for key in leaked:
        if before[key] is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before[key]  # type: ignore[assignment]
    live_group = dist.is_available() and dist.is_initialized()
    if live_group:
        dist.destroy_process_group()
    assert not leaked, f"test leaked environment variables: {leaked}"
    assert not live_group, "test left a torch.distributed process group alive"


def has_checkpoint_callback(callbacks: Any) -> bool:
    """Whether ``Trainer(callbacks=...)`` holds a ``ModelCheckpoint`` (or another checkpoint callback)."""
    from fullshard.callbacks import Checkpoint

    given = [callbacks] if not isinstance(callbacks, list | tuple) else list(callbacks)
    return any(isinstance(cb, Checkpoint) for cb in given)


def quiet_trainer(root: Path, **kwargs: Any) -> Any:
    """A one-process CPU Trainer without logger, checkpoints or progress bar (``kwargs`` override;
    checkpoints are enabled when ``callbacks`` holds a checkpoint callback, as the Trainer refuses
    one with ``enable_checkpointing=False``)."""
    import fullshard

    defaults: dict[str, Any] = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=has_checkpoint_callback(kwargs.get("callbacks")),
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    return fullshard.Trainer(**{**defaults, **kwargs})


def run_script(
    name: str,
    *args: str,
    timeout: float = 120,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    fresh_python: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``tests/scripts/<name>`` in a new Python process (which may launch more), forked by
    the fork server ([Note: the fork server] in forkserver.py); ``fresh_python``: in a real
    ``python`` (tests of start-up, exit, signals); ``env``: extra environment variables."""
    extra = env or {}
    env = {k: v for k, v in os.environ.items() if k not in _WATCHED_ENV}
    env.update(extra)
    env["PYTHONUNBUFFERED"] = "1"
    return subprocess.run(
        [sys.executable if fresh_python else forkserver.python(), str(SCRIPTS / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env,
    )


def check_ok(result: subprocess.CompletedProcess[str]) -> None:
    """Fail with the process output when it did not exit 0."""
    assert result.returncode == 0, (
        f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    )


@pytest.fixture
def captured(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Records of the fullshard loggers (they do not propagate to the root logger)."""
    logger = logging.getLogger("fullshard")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="fullshard")
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)
