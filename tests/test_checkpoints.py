"""Checkpoints with several real processes: exact resume under FULL_SHARD, resharding, faults."""

from __future__ import annotations

import functools
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import fullshard
from ckpt_helpers import assert_same_state, full_state, killed_at, run_scenarios, run_single
from conftest import check_ok, quiet_trainer, run_script
from fullshard.checkpoint.tools import inspect

pytestmark = pytest.mark.multiprocess
STEPS_PER_EPOCH = 6  # 96 samples / (2 ranks x batch 8)


def _job(out: Path, *args: str, timeout: float = 120) -> None:
    check_ok(run_script("ckpt_job.py", "--out", str(out), *args, timeout=timeout))


def _final(out: Path) -> dict:
    final = torch.load(out / "final.pt", weights_only=False)
    return {"model": final["model"], "optimizers": final["optimizers"], "global_step": final["global_step"]}


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """12 uninterrupted FULL_SHARD steps on 2 ranks, saving a checkpoint every 3 steps; one job per
    format, on first use (the fault tests start from its step-3 checkpoints too)."""

    @functools.cache
    def run(fmt: str) -> Path:
        out = tmp_path_factory.mktemp(f"straight_{fmt}")
        _job(out, "--format", fmt, "--max-steps", "12", "--save-every", "3", "--keep", "-1")
        return out

    return run


@pytest.fixture(scope="module", params=["full", "sharded"])
def straight(request: pytest.FixtureRequest, straight_run: Callable[[str], Path]) -> tuple[str, Path]:
    return request.param, straight_run(request.param)


def _ckpt(out: Path, step: int) -> Path:
    epoch = step // STEPS_PER_EPOCH if step % STEPS_PER_EPOCH else step // STEPS_PER_EPOCH - 1
    return out / "ckpts" / f"epoch={epoch}-step={step}.ckpt"


@pytest.fixture(scope="module")
def resumed(straight: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The 2-rank runs that start from the straight run's checkpoints, in one job per format:
    FULL_SHARD resumes from steps 6 and 9 (``resume6``, ``resume9``); for the full format a DDP
    resume from step 12 (``ddp``); for the sharded one, 5 steps resumed from a checkpoint that one
    process wrote (``two``, its state under ``"single"``)."""
    fmt, out = straight
    root = tmp_path_factory.mktemp(f"resumed_{fmt}")
    runs = [
        [
            "--out",
            str(root / f"resume{step}"),
            "--format",
            fmt,
            "--max-steps",
            "12",
            "--resume",
            str(_ckpt(out, step)),
        ]
        for step in (6, 9)
    ]
    found: dict[str, Any] = {"root": root}
    if fmt == "full":
        last = str(out / "ckpts" / "epoch=1-step=12.ckpt")
        runs.append(["--out", str(root / "ddp"), "--strategy", "ddp", "--resume", last, "--max-steps", "12"])
    else:
        single = root / "from_one"  # 1 -> 2
        trainer, _ = run_single(root, fmt="sharded", max_steps=5, save=single)
        found["single"] = full_state(trainer)
        runs.append(["--out", str(root / "two"), "--resume", str(single), "--max-steps", "5"])
    run_scenarios(root, runs)
    return found


@pytest.mark.parametrize("step", [6, 9], ids=["epoch-boundary", "mid-epoch"])
def test_resume_is_bitwise_identical(straight: tuple[str, Path], resumed: dict[str, Any], step: int) -> None:
    fmt, out = straight
    ckpt = _ckpt(out, step)
    assert ckpt.is_file() if fmt == "full" else (ckpt / "fullshard-checkpoint.json").is_file()
    run = resumed["root"] / f"resume{step}"  # --format fmt --max-steps 12 --resume ckpt
    for rank in (0, 1):
        expected = json.loads((out / f"losses_rank{rank}.json").read_text())[step:]
        assert json.loads((run / f"losses_rank{rank}.json").read_text()) == expected, f"rank {rank}"
    assert_same_state(_final(run), _final(out))


@pytest.mark.parametrize("straight", ["sharded"], indirect=True)  # resharding: the sharded format's
def test_sharded_checkpoint_reshards(
    straight: tuple[str, Path], resumed: dict[str, Any], tmp_path: Path
) -> None:
    _, out = straight
    ckpt = out / "ckpts" / "epoch=1-step=12.ckpt"
    expected = _final(out)
    _job(tmp_path / "three", "--devices", "3", "--resume", str(ckpt), "--max-steps", "12")  # 2 -> 3
    assert_same_state(_final(tmp_path / "three"), expected)
    trainer, _ = run_single(tmp_path / "one", fmt="sharded", max_steps=12, resume=ckpt)  # 2 -> 1
    assert_same_state(full_state(trainer), expected)
    # 1 -> 2: run_single(fmt="sharded", max_steps=5) saved, 2 ranks resumed it (see resumed)
    assert_same_state(_final(resumed["root"] / "two"), resumed["single"])


@pytest.mark.parametrize("straight", ["full"], indirect=True)  # the full format is the portable one
def test_full_checkpoint_loads_in_every_strategy(
    straight: tuple[str, Path], resumed: dict[str, Any], tmp_path: Path
) -> None:
    _, out = straight
    ckpt = out / "ckpts" / "epoch=1-step=12.ckpt"
    expected = _final(out)
    assert_same_state(_final(resumed["root"] / "ddp"), expected)  # DDP, --resume ckpt (see resumed)
    trainer, model = run_single(tmp_path, max_steps=12, resume=ckpt)
    assert_same_state(full_state(trainer), expected)
    plain = torch.load(ckpt, weights_only=False)["state_dict"]
    type(model)().load_state_dict(plain)


@pytest.mark.parametrize("straight", ["sharded"], indirect=True)  # one damaged layout is enough
def test_damaged_checkpoint_fails_on_every_rank(straight: tuple[str, Path], tmp_path: Path) -> None:
    _, out = straight
    broken = shutil.copytree(out / "ckpts" / "epoch=0-step=3.ckpt", tmp_path / "broken")
    next(broken.glob("data-*/__1_0.distcp")).unlink()
    start = time.monotonic()
    result = run_script("ckpt_job.py", "--out", str(tmp_path), "--resume", str(broken), timeout=90)
    assert result.returncode != 0 and time.monotonic() - start < 60
    assert result.stderr.count("CorruptCheckpointError: The sharded checkpoint") >= 1
    assert "__1_0.distcp is missing" in result.stderr


# ------------------------------------------------------------------------------------ faults
@pytest.fixture(scope="module")
def previous(straight_run: Callable[[str], Path]) -> dict[str, Path]:
    """A complete checkpoint at step 3 for each format, written by FSDP on 2 ranks (the straight
    run's)."""
    return {fmt: _ckpt(straight_run(fmt), 3) for fmt in ("full", "sharded")}


FAULTS = [
    ("full", "0:full.mid_data"),
    ("full", "0:full.before_commit"),
    ("sharded", "1:sharded.data_written"),  # rank 1's shard written, rank 0 still writing or waiting
    ("sharded", "0:sharded.metadata_written"),  # all data and DCP's .metadata written, no commit
    ("sharded", "0:sharded.before_commit"),  # commit record written to its temporary file, not renamed
]
# A 2-rank FSDP job SIGKILLed at the point, one per format: a torn write with the writeback thread
# running, and the kill that only several ranks have (one rank dead, the other still saving). The
# other points get the same SIGKILL in a forked one-process save (ckpt_helpers.killed_at): what
# is on disk when the save dies there is the same, without a job's start-up.
REAL_KILLS = {("full", "0:full.mid_data"), ("sharded", "1:sharded.data_written")}


@pytest.mark.parametrize(("fmt", "fault"), FAULTS, ids=[f"{f}-{p}" for f, p in FAULTS])
def test_killed_save_never_damages_the_previous_checkpoint(
    previous: dict[str, Path], tmp_path: Path, fmt: str, fault: str
) -> None:
    path = tmp_path / "ckpt"
    (shutil.copytree if fmt == "sharded" else shutil.copy)(previous[fmt], path)
    if (fmt, fault) in REAL_KILLS:
        start = time.monotonic()
        result = run_script(
            "ckpt_job.py",
            "--out",
            str(tmp_path / "run"),
            "--format",
            fmt,
            "--max-steps",
            "5",
            "--save",
            str(path),
            "--fault",
            fault,
            timeout=90,
        )
        assert result.returncode != 0, "the killed save should have ended the job with an error"
        assert time.monotonic() - start < 60
    else:
        rank, point = fault.split(":", 1)
        assert rank == "0"
        killed_at(point, lambda: run_single(tmp_path / "run", fmt=fmt, max_steps=5, save=path))
    report = inspect(path, verify_checksums=True)
    assert (report.complete, report.verified, report.global_step) == (True, True, 3), report
    trainer, _ = run_single(tmp_path, fmt=fmt, max_steps=3, resume=path)  # loads, and holds step 3
    assert trainer.global_step == 3


def test_killed_after_commit_keeps_the_new_checkpoint(previous: dict[str, Path], tmp_path: Path) -> None:
    path = shutil.copytree(previous["sharded"], tmp_path / "ckpt")
    # SIGKILLed in a forked one-process save (the sharded format's real-job kill is above)
    killed_at(
        "sharded.after_commit", lambda: run_single(tmp_path / "run", fmt="sharded", max_steps=5, save=path)
    )
    report = inspect(path, verify_checksums=True)
    assert (report.complete, report.verified, report.global_step) == (True, True, 5)
    assert len(list(path.glob("data-*"))) == 2  # the old data was not yet removed ...
    run_single(tmp_path, fmt="sharded", max_steps=6, resume=path, save=path)
    assert len(list(path.glob("data-*"))) == 1  # ... and the next save cleans it up


class _Regression(fullshard.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.losses: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])
        self.losses.append(float(loss))
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=0.1)


class _SaveAtStart(fullshard.Callback):
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        trainer.save_checkpoint(trainer.default_root_dir + "/start.ckpt")


def test_a_checkpoint_saved_before_the_first_step_leaves_the_run_as_it_was(tmp_path: Path) -> None:
    # torch's state-dict API fills an empty optimizer state with a zero-gradient step; AdamW's
    # step count was then one ahead, and the second step's loss differed
    def losses(callbacks: list[Any], ckpt_path: Path | None = None) -> list[float]:
        fullshard.seed_everything(0)
        module = _Regression()
        data = DataLoader(TensorDataset(torch.randn(12, 4), torch.randn(12, 1)), batch_size=4)
        quiet_trainer(tmp_path, max_steps=3, callbacks=callbacks).fit(module, data, ckpt_path=ckpt_path)
        return module.losses

    uninterrupted = losses([])
    assert losses([_SaveAtStart()]) == uninterrupted
    # ... and a run resumed from that checkpoint is the same run too (AdamW's step count included)
    assert losses([], ckpt_path=tmp_path / "start.ckpt") == uninterrupted


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
def test_a_sharded_checkpoint_saved_before_the_first_step_resumes_the_same_run(
    strategy: str, tmp_path: Path
) -> None:
    # DCP loads into a template of the optimizer's state: the checkpoint has none for AdamW before
    # its first step, and FSDP1's planner looked for an "optimizers" key of its own
    check_ok(run_script("unstepped_save_job.py", "--strategy", strategy, "--out", str(tmp_path)))
    runs = json.loads((tmp_path / "losses.json").read_text())
    assert runs["saved"] == runs["uninterrupted"]
    assert runs["resumed"] == runs["uninterrupted"]
