"""Preemption: SIGTERM to one rank mid-training saves a checkpoint at a step every rank agrees
on, ends the job with 128 + 15, requeues under SLURM, and fit(ckpt_path="last") goes on exactly.

Run: pytest tests/test_preemption.py
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch

import fullshard
from conftest import check_ok, run_script
from fullshard.errors import MisconfigurationError
from fullshard.trainer.preemption import Preemption, TrainingPreempted, parse_signals

MAX_STEPS = 20


def _job(out: Path, *args: str, env: dict[str, str] | None = None, signalled: bool = False):  # type: ignore[no-untyped-def]
    """``signalled``: a run that gets the preemption signal (the subject here) runs in a real python."""
    args = ("--out", str(out), "--max-steps", str(MAX_STEPS), *args)
    return run_script("preempt_job.py", *args, timeout=120, env=env, fresh_python=signalled)


def _losses(out: Path, tag: str, rank: int) -> list[float]:
    return json.loads((out / f"losses{tag}_rank{rank}.json").read_text())


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """Uninterrupted runs, one per strategy, made when first asked for."""
    made: dict[tuple[str, str], Path] = {}

    class Runs(dict):  # type: ignore[type-arg]
        def __missing__(self, key: tuple[str, str]) -> Path:
            out = tmp_path_factory.mktemp(f"straight_{key[0]}_{key[1]}")
            check_ok(_job(out, "--strategy", key[0], "--format", key[1]))
            self[key] = out
            return out

    return Runs(made)


CASES = [
    ("ddp", "full", 1, False),
    ("fsdp", "full", 0, False),
    ("fsdp", "sharded", 1, False),
    ("fsdp", "sharded", 0, True),  # a second SIGTERM while the checkpoint is being saved
]


@pytest.mark.multiprocess
@pytest.mark.slow  # a preempted job and its requeued run: -m "not slow" skips them locally
@pytest.mark.parametrize(
    ("strategy", "fmt", "rank", "twice"),
    CASES,
    ids=[f"{s}-{f}-rank{r}{'-twice' if t else ''}" for s, f, r, t in CASES],
)
def test_preempted_run_resumes_exactly(
    straight: dict[tuple[str, str], Path], tmp_path: Path, strategy: str, fmt: str, rank: int, twice: bool
) -> None:
    reference = straight[(strategy, "full")]  # the format changes nothing in training
    args = ["--strategy", strategy, "--format", fmt]
    signal_args = ["--signal-rank", str(rank), "--signal-step", "4", *(["--twice"] if twice else [])]
    preempted = _job(tmp_path, *args, *signal_args, env={"SLURM_JOB_ID": "4242"}, signalled=True)
    assert preempted.returncode == 128 + signal.SIGTERM, preempted.stderr
    assert "saved" in preempted.stdout and "requeued SLURM job 4242" in preempted.stdout, preempted.stdout
    assert "stopping the other processes" not in preempted.stderr  # not treated as a failure
    assert (tmp_path / "requeued.txt").read_text() == "4242"
    before = _losses(tmp_path, "", 0)
    assert 4 < len(before) < MAX_STEPS  # stopped after the signal, before the end
    check_ok(_job(tmp_path, *args, "--resume", "--tag", "_resumed"))
    for r in (0, 1):
        assert _losses(tmp_path, "", r) + _losses(tmp_path, "_resumed", r) == _losses(reference, "", r), (
            f"rank {r}"
        )
    final, expected = torch.load(tmp_path / "final.pt"), torch.load(reference / "final.pt")
    assert final["global_step"] == expected["global_step"] == MAX_STEPS
    for key, value in expected["model"].items():
        assert torch.equal(final["model"][key], value), key


@pytest.mark.multiprocess
@pytest.mark.parametrize("skip", ["return-none", "nonfinite"])
def test_preemption_while_every_step_is_skipped(tmp_path: Path, skip: str) -> None:
    """No optimizer step has a gradient (training_step returns None), or none is taken (every loss
    is NaN with on_nonfinite_loss="skip"): the signal still saves at a boundary the ranks agree on and ends
    the job, instead of being noted and ignored until SIGKILL."""
    out = tmp_path / "run"
    job = _job(
        out, "--strategy", "fsdp", "--skip", skip, "--signal-rank", "1", "--signal-step", "3", signalled=True
    )
    assert job.returncode == 128 + signal.SIGTERM, job.stdout + job.stderr
    assert "SIGTERM received; saved" in job.stdout
    batches = len(_losses(out, "", 0))
    assert 3 < batches < 12  # 3 epochs of 6 batches: stopped soon after the signal, not at the end
    saved = torch.load(out / "ckpts" / "last.ckpt", weights_only=True)
    # a None step counts (as in Lightning), a skipped non-finite one does not
    assert saved["global_step"] == (0 if skip == "nonfinite" else batches)
    assert saved["loops"]["total_batch_idx"] == batches


def test_single_process_preemption(tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    from ckpt_helpers import Net, make_data

    class Signal(fullshard.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):  # type: ignore[no-untyped-def]
            if trainer.global_step == 2:
                os.kill(os.getpid(), signal.SIGUSR1)

    trainer = fullshard.Trainer(
        accelerator="cpu", devices=1, max_steps=6, logger=False, enable_progress_bar=False,
        enable_checkpointing=False, callbacks=[Signal()], default_root_dir=tmp_path,
    )  # fmt: skip
    with pytest.raises(TrainingPreempted) as caught:
        trainer.fit(Net(), DataLoader(make_data(), batch_size=8))
    assert caught.value.code == 128 + signal.SIGUSR1 and caught.value.step == 3  # the next step boundary
    assert caught.value.path == str(tmp_path / "last.ckpt") and (tmp_path / "last.ckpt").is_file()
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # handlers put back
    resumed = fullshard.Trainer(
        accelerator="cpu", devices=1, max_steps=6, logger=False, enable_progress_bar=False,
        enable_checkpointing=False, default_root_dir=tmp_path,
    )  # fmt: skip
    resumed.fit(Net(), DataLoader(make_data(), batch_size=8), ckpt_path=tmp_path / "last.ckpt")
    assert resumed.global_step == 6


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, ()),
        ((), ()),
        ("SIGTERM", (signal.SIGTERM,)),
        (["sigterm", signal.SIGUSR1, int(signal.SIGUSR2)], (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)),
    ],
)
def test_signal_forms(value: object, expected: tuple[signal.Signals, ...]) -> None:
    assert parse_signals(value) == expected


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("SIGNOPE", r"preemption_signals got 'SIGNOPE', which is not a signal that can be handled"),
        (["SIGKILL"], r"SIGKILL and SIGSTOP cannot be caught"),
        (3.5, r"preemption_signals=3\.5 is not a signal or a list of signals"),
    ],
)
def test_bad_signals_are_refused(value: object, match: str, tmp_path: Path) -> None:
    with pytest.raises(MisconfigurationError, match=match):
        fullshard.Trainer(accelerator="cpu", devices=1, preemption_signals=value, default_root_dir=tmp_path)


def test_off_means_no_handler(tmp_path: Path) -> None:
    idle = Preemption((), requeue=False)
    assert not idle.requested
    trainer = fullshard.Trainer(
        accelerator="cpu", devices=1, preemption_signals=None, default_root_dir=tmp_path
    )
    assert trainer._preemption_signals == ()
