"""Ranks that take different paths (one skips a step, one runs out of data): the job ends
promptly with a RankDivergenceError naming the ranks, instead of hanging in a collective.

Run: pytest tests/test_divergence.py  (add -m "not multiprocess" for the fast unit tests only)
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as dist

import forkserver
import fullshard.strategies.parallel as parallel
from conftest import SCRIPTS
from fullshard.errors import MisconfigurationError, RankDivergenceError
from fullshard.strategies import DDPStrategy, FSDPStrategy

JOB_TIMEOUT_S = 90  # far above what any scenario needs; a hang fails the test instead of the run
AGREEMENT_S = 3  # the jobs' rank_agreement_timeout: short, so that each test stays well under 20 s
PROMPT_S = 60  # the promise: a diverging job ends within this, with the default timeout too


# ---------------------------------------------------------------------------------------------
# The agreement itself, in this process: two strategies as ranks 0 and 1 sharing one store


class _Rank(DDPStrategy):
    """A DDPStrategy that believes it is ``rank`` of two."""

    def __init__(self, rank: int, timeout_s: float) -> None:
        super().__init__(rank_agreement_timeout=timedelta(seconds=timeout_s))
        self._rank = rank

    @property
    def global_rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return 2


@pytest.fixture
def shared_store(monkeypatch: pytest.MonkeyPatch) -> dist.Store:
    store = dist.HashStore()
    monkeypatch.setattr(parallel, "_default_store", lambda: store)
    monkeypatch.setattr(parallel.dist, "is_initialized", lambda: True)
    return store


def _report_on_both(
    calls: dict[int, tuple[str, str, str]], timeout_s: float
) -> dict[int, BaseException | None]:
    """Run ``check_rank_agreement(*calls[rank])`` for ranks 0 and 1 at once; what each raised."""
    outcome: dict[int, BaseException | None] = {}

    def report(rank: int) -> None:
        try:
            _Rank(rank, timeout_s).check_rank_agreement(*calls[rank])
            outcome[rank] = None
        except BaseException as error:
            outcome[rank] = error

    threads = [threading.Thread(target=report, args=(rank,)) for rank in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcome


def test_ranks_reporting_the_same_event_go_on(shared_store: dist.Store) -> None:
    same = ("skip", "0:3", "training_step returned None at epoch 0, batch 3")
    assert _report_on_both({0: same, 1: same}, timeout_s=10) == {0: None, 1: None}
    # A second fit in the same processes meets the same keys again.
    assert _report_on_both({0: same, 1: same}, timeout_s=10) == {0: None, 1: None}


def test_a_rank_skipping_alone_raises_naming_the_ranks(shared_store: dist.Store) -> None:
    start = time.monotonic()
    outcome = _report_on_both({1: ("skip", "0:2", "training_step returned None at epoch 0, batch 2")}, 0.3)
    assert time.monotonic() - start < 5
    with pytest.raises(
        RankDivergenceError,
        match=r"(?s)^Rank 1 skipped a training step \(training_step returned None at epoch 0, batch 2\), but"
        r" rank 0 did not within 0\.3 s.*`return loss \* 0`",
    ):
        raise outcome[1]  # type: ignore[misc]


def test_ranks_at_different_points_both_raise(shared_store: dist.Store) -> None:
    outcome = _report_on_both(
        {
            0: ("end_of_data", "3", "the training data ended after 3 batches"),
            1: ("end_of_data", "5", "the training data ended after 5 batches"),
        },
        timeout_s=0.3,
    )
    with pytest.raises(
        RankDivergenceError,
        match=r"(?s)^Rank 0 ran out of training data \(the training data ended after 3 batches\), but rank 1"
        r" did not.*same length",
    ):
        raise outcome[0]  # type: ignore[misc]
    assert isinstance(outcome[1], RankDivergenceError)
    assert str(outcome[1]).startswith("Rank 1 ran out of training data (the training data ended after 5")


def test_an_unknown_event_gets_a_generic_message(shared_store: dist.Store) -> None:
    outcome = _report_on_both({0: ("rewind", "7", "rewound")}, timeout_s=0.2)
    with pytest.raises(
        RankDivergenceError, match=r"^Rank 0 reported 'rewind' at 7 \(rewound\), but rank 1 did not"
    ):
        raise outcome[0]  # type: ignore[misc]


def test_one_process_has_nothing_to_agree_on() -> None:
    DDPStrategy().check_rank_agreement("skip", "0:0", "training_step returned None")  # returns at once


@pytest.mark.parametrize("strategy_class", [DDPStrategy, FSDPStrategy])
def test_rank_agreement_timeout_is_passed_through(strategy_class: Any) -> None:
    strategy = strategy_class(rank_agreement_timeout=timedelta(seconds=7))
    assert strategy.rank_agreement_timeout == timedelta(seconds=7)
    assert strategy_class().rank_agreement_timeout == parallel.DEFAULT_RANK_AGREEMENT_TIMEOUT
    assert parallel.DEFAULT_RANK_AGREEMENT_TIMEOUT.total_seconds() <= 30


@pytest.mark.parametrize("value", [5, timedelta(0), None])
def test_rank_agreement_timeout_must_be_a_positive_timedelta(value: Any) -> None:
    with pytest.raises(
        MisconfigurationError, match=r"rank_agreement_timeout must be a positive datetime\.timedelta"
    ):
        DDPStrategy(rank_agreement_timeout=value)


# ---------------------------------------------------------------------------------------------
# Real two-process jobs (tests/scripts/diverge_job.py)


@dataclass(frozen=True)
class _JobRun:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    ended: float  # time.time() when it ended

    def __str__(self) -> str:
        return (
            f"returncode={self.returncode} after {self.seconds:.1f}s\n"
            f"--stdout--\n{self.stdout}\n--stderr--\n{self.stderr}"
        )

    @property
    def seconds_training(self) -> float:
        """From the start of training to the job's end: what a diverging rank must bound, without
        the start-up that a loaded machine slows (the job prints when training starts)."""
        started = re.search(r"^training starts at ([0-9.]+)$", self.stdout, re.MULTILINE)
        assert started is not None, str(self)
        return self.ended - float(started.group(1))


def _run_job(strategy: str, scenario: str, agreement_s: float = AGREEMENT_S) -> _JobRun:
    command = [
        forkserver.python(),
        str(SCRIPTS / "diverge_job.py"),
        "--strategy",
        strategy,
        "--scenario",
        scenario,
        "--agreement-timeout",
        str(agreement_s),
    ]
    env = {
        k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "WORLD_SIZE", "RANK", "MASTER_PORT")
    }
    start = time.monotonic()
    # A session of its own, so that a hung job can be killed whole (its process group).
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env
    )
    try:
        stdout, stderr = process.communicate(timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"the job did not end within {JOB_TIMEOUT_S}s\n{stdout}\n{stderr}")
    return _JobRun(process.returncode, stdout, stderr, time.monotonic() - start, time.time())


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_step_skipped_on_rank_1_only_ends_the_job(strategy: str) -> None:
    run = _run_job(strategy, "skip_rank1")
    assert run.returncode != 0, str(run)
    assert run.seconds_training < PROMPT_S, str(run)
    assert (
        "RankDivergenceError: Rank 1 skipped a training step (training_step returned None at epoch 0,"
        f" batch 2), but rank 0 did not within {AGREEMENT_S} s" in run.stderr
    ), str(run)
    assert "Return a zero loss that keeps the graph instead of None (e.g. `return loss * 0`)" in run.stderr
    assert "diverge-test" not in run.stdout, str(run)


@pytest.mark.multiprocess
def test_ranks_with_different_amounts_of_data_end_the_job() -> None:
    run = _run_job("ddp", "uneven_data")
    assert run.returncode != 0, str(run)
    assert run.seconds_training < PROMPT_S, str(run)
    assert (
        "RankDivergenceError: Rank 0 ran out of training data (the training data ended after 3 batches),"
        f" but rank 1 did not within {AGREEMENT_S} s" in run.stderr
    ), str(run)
    assert "make every rank's data the same length" in run.stderr, str(run)


@pytest.mark.multiprocess
def test_a_step_skipped_on_every_rank_trains_on() -> None:
    # 2 epochs of 4 batches, batch 1 returns None everywhere: its optimizer step still counts, as in
    # Lightning, so 4 optimizer steps per epoch. The data is iterable and ends at the same point on
    # both ranks, which must agree too.
    run = _run_job("ddp", "skip_all", agreement_s=15)
    assert run.returncode == 0, str(run)
    for rank in (0, 1):
        assert f"diverge-test rank={rank} global_step=8 batches=8" in run.stdout, str(run)
    assert "RankDivergenceError" not in run.stderr, str(run)
