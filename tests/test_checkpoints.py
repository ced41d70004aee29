"""Checkpoints with several real processes: exact resume under FULL_SHARD, resharding, faults."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import torch

from ckpt_helpers import assert_same_state, full_state, run_single
from conftest import check_ok, run_script
from fullshard.checkpoint.tools import inspect

pytestmark = pytest.mark.multiprocess
STEPS_PER_EPOCH = 6  # 96 samples / (2 ranks x batch 8)


def _job(out: Path, *args: str, timeout: float = 120) -> None:
    check_ok(run_script("ckpt_job.py", "--out", str(out), *args, timeout=timeout))


def _final(out: Path) -> dict:
    final = torch.load(out / "final.pt", weights_only=False)
    return {"model": final["model"], "optimizers": final["optimizers"], "global_step": final["global_step"]}


@pytest.fixture(scope="module", params=["full", "sharded"])
def straight(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """12 uninterrupted FULL_SHARD steps on 2 ranks, saving a checkpoint every 3 steps."""
    fmt = request.param
    out = tmp_path_factory.mktemp(f"straight_{fmt}")
    _job(out, "--format", fmt, "--max-steps", "12", "--save-every", "3", "--keep", "-1")
    return fmt, out


@pytest.mark.parametrize("step", [6, 9], ids=["epoch-boundary", "mid-epoch"])
def test_resume_is_bitwise_identical(straight: tuple[str, Path], tmp_path: Path, step: int) -> None:
    fmt, out = straight
    epoch = step // STEPS_PER_EPOCH if step % STEPS_PER_EPOCH else step // STEPS_PER_EPOCH - 1
    ckpt = out / "ckpts" / f"epoch={epoch}-step={step}.ckpt"
    assert ckpt.is_file() if fmt == "full" else (ckpt / "fullshard-checkpoint.json").is_file()
    _job(tmp_path, "--format", fmt, "--max-steps", "12", "--resume", str(ckpt))
    for rank in (0, 1):
        expected = json.loads((out / f"losses_rank{rank}.json").read_text())[step:]
        assert json.loads((tmp_path / f"losses_rank{rank}.json").read_text()) == expected, f"rank {rank}"
    assert_same_state(_final(tmp_path), _final(out))


def test_sharded_checkpoint_reshards(straight: tuple[str, Path], tmp_path: Path) -> None:
    fmt, out = straight
    if fmt != "sharded":
        pytest.skip("resharding is a property of the sharded format")
    ckpt = out / "ckpts" / "epoch=1-step=12.ckpt"
    expected = _final(out)
    _job(tmp_path / "three", "--devices", "3", "--resume", str(ckpt), "--max-steps", "12")  # 2 -> 3
    assert_same_state(_final(tmp_path / "three"), expected)
    trainer, _ = run_single(tmp_path / "one", fmt="sharded", max_steps=12, resume=ckpt)  # 2 -> 1
    assert_same_state(full_state(trainer), expected)
    single = tmp_path / "from_one"  # 1 -> 2
    trainer, _ = run_single(tmp_path, fmt="sharded", max_steps=5, save=single)
    _job(tmp_path / "two", "--resume", str(single), "--max-steps", "5")
    assert_same_state(_final(tmp_path / "two"), full_state(trainer))


def test_full_checkpoint_loads_in_every_strategy(straight: tuple[str, Path], tmp_path: Path) -> None:
    fmt, out = straight
    if fmt != "full":
        pytest.skip("the full format is the portable one")
    ckpt = out / "ckpts" / "epoch=1-step=12.ckpt"
    expected = _final(out)
    _job(tmp_path / "ddp", "--strategy", "ddp", "--resume", str(ckpt), "--max-steps", "12")
    assert_same_state(_final(tmp_path / "ddp"), expected)
    trainer, model = run_single(tmp_path, max_steps=12, resume=ckpt)
    assert_same_state(full_state(trainer), expected)
    plain = torch.load(ckpt, weights_only=False)["state_dict"]
    type(model)().load_state_dict(plain)


def test_damaged_checkpoint_fails_on_every_rank(straight: tuple[str, Path], tmp_path: Path) -> None:
    fmt, out = straight
    if fmt != "sharded":
        pytest.skip("one damaged layout is enough")
    broken = shutil.copytree(out / "ckpts" / "epoch=0-step=3.ckpt", tmp_path / "broken")
    next(broken.glob("data-*/__1_0.distcp")).unlink()
    start = time.monotonic()
    result = run_script("ckpt_job.py", "--out", str(tmp_path), "--resume", str(broken), timeout=90)
    assert result.returncode != 0 and time.monotonic() - start < 60
    assert result.stderr.count("CorruptCheckpointError: The sharded checkpoint") >= 1
    assert "__1_0.distcp is missing" in result.stderr


# ------------------------------------------------------------------------------------ faults
@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A complete checkpoint at step 3 for each format, written by FSDP on 2 ranks."""
    root = tmp_path_factory.mktemp("previous")
    paths = {}
    for fmt in ("full", "sharded"):
        _job(root / fmt, "--format", fmt, "--max-steps", "3", "--save", str(root / f"{fmt}.ckpt"))
        paths[fmt] = root / f"{fmt}.ckpt"
    return paths


FAULTS = [
    ("full", "0:full.mid_data"),
    ("full", "0:full.before_commit"),
    ("sharded", "1:sharded.data_written"),  # rank 1's shard written, rank 0 still writing or waiting
    ("sharded", "0:sharded.metadata_written"),  # all data and DCP's .metadata written, no commit
    ("sharded", "0:sharded.before_commit"),  # commit record written to its temporary file, not renamed
]


@pytest.mark.parametrize(("fmt", "fault"), FAULTS, ids=[f"{f}-{p}" for f, p in FAULTS])
def test_killed_save_never_damages_the_previous_checkpoint(
    previous: dict[str, Path], tmp_path: Path, fmt: str, fault: str
) -> None:
    path = tmp_path / "ckpt"
    (shutil.copytree if fmt == "sharded" else shutil.copy)(previous[fmt], path)
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
    report = inspect(path, verify_checksums=True)
    assert (report.complete, report.verified, report.global_step) == (True, True, 3), report
    trainer, _ = run_single(tmp_path, fmt=fmt, max_steps=3, resume=path)  # loads, and holds step 3
    assert trainer.global_step == 3


def test_killed_after_commit_keeps_the_new_checkpoint(previous: dict[str, Path], tmp_path: Path) -> None:
    path = shutil.copytree(previous["sharded"], tmp_path / "ckpt")
    result = run_script(
        "ckpt_job.py",
        "--out",
        str(tmp_path / "run"),
        "--format",
        "sharded",
        "--max-steps",
        "5",
        "--save",
        str(path),
        "--fault",
        "0:sharded.after_commit",
        timeout=90,
    )
    assert result.returncode != 0
    report = inspect(path, verify_checksums=True)
    assert (report.complete, report.verified, report.global_step) == (True, True, 5)
    assert len(list(path.glob("data-*"))) == 2  # the old data was not yet removed ...
    run_single(tmp_path, fmt="sharded", max_steps=6, resume=path, save=path)
    assert len(list(path.glob("data-*"))) == 1  # ... and the next save cleans it up
