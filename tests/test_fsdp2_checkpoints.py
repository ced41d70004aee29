"""FSDP2 checkpoints on CPU processes: exact resume in both formats, and checkpoints that cross
between fsdp (FSDP1) and fsdp2 at the same and another world size, and into ddp and one process.

Run: pytest tests/test_fsdp2_checkpoints.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ckpt_helpers import assert_same_state, full_state, run_single
from conftest import check_ok, run_script

pytestmark = pytest.mark.multiprocess


def _job(out: Path, *args: str, timeout: float = 150) -> None:
    check_ok(run_script("ckpt_job.py", "--out", str(out), *args, timeout=timeout))


def _final(out: Path) -> dict:
    final = torch.load(out / "final.pt", weights_only=False)
    return {"model": final["model"], "optimizers": final["optimizers"], "global_step": final["global_step"]}


def _losses(out: Path, rank: int) -> list[float]:
    return json.loads((out / f"losses_rank{rank}.json").read_text())


@pytest.fixture(scope="module", params=["full", "sharded"])
def straight(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """10 uninterrupted fsdp2 steps on 2 ranks, a checkpoint every 5 (mid-epoch: 6 steps an epoch)."""
    fmt = request.param
    out = tmp_path_factory.mktemp(f"fsdp2_{fmt}")
    _job(out, "--strategy", "fsdp2", "--format", fmt, "--max-steps", "10", "--save-every", "5", "--keep", "-1")
    return fmt, out


def test_resume_is_bitwise_identical(straight: tuple[str, Path], tmp_path: Path) -> None:
    # 2N straight vs N + save + a new process + N
    fmt, out = straight
    ckpt = out / "ckpts" / "epoch=0-step=5.ckpt"
    _job(tmp_path, "--strategy", "fsdp2", "--format", fmt, "--max-steps", "10", "--resume", str(ckpt))
    for rank in (0, 1):
        assert _losses(tmp_path, rank) == _losses(out, rank)[5:], f"rank {rank}"
    assert_same_state(_final(tmp_path), _final(out))


@pytest.mark.parametrize(("writer", "reader"), [("fsdp2", "fsdp"), ("fsdp", "fsdp2")])
def test_checkpoints_cross_between_fsdp_and_fsdp2(
    straight: tuple[str, Path], tmp_path: Path, writer: str, reader: str
) -> None:
    fmt, fsdp2_out = straight
    if writer == "fsdp2":
        ckpt, expected = fsdp2_out / "ckpts" / "epoch=1-step=10.ckpt", _final(fsdp2_out)
    else:
        ckpt = tmp_path / "fsdp1.ckpt"
        _job(tmp_path / "w", "--strategy", "fsdp", "--format", fmt, "--max-steps", "10", "--save", str(ckpt))
        expected = _final(tmp_path / "w")
    # a full checkpoint holds whole tensors (any world size reads them alike): 2 -> 2; a sharded
    # one is resharded by DCP between FSDP1's ShardedTensors and FSDP2's DTensors: 2 -> 3
    devices = "3" if fmt == "sharded" else "2"
    _job(tmp_path / "r", "--strategy", reader, "--devices", devices, "--format", fmt, "--resume", str(ckpt), "--max-steps", "10")  # fmt: skip
    assert_same_state(_final(tmp_path / "r"), expected)


def test_fsdp2_checkpoints_load_under_ddp_and_one_process(straight: tuple[str, Path], tmp_path: Path) -> None:
    fmt, out = straight
    ckpt, expected = out / "ckpts" / "epoch=1-step=10.ckpt", _final(out)
    _job(tmp_path / "ddp", "--strategy", "ddp", "--format", fmt, "--resume", str(ckpt), "--max-steps", "10")
    assert_same_state(_final(tmp_path / "ddp"), expected)
    trainer, _ = run_single(tmp_path, fmt=fmt, max_steps=10, resume=ckpt)
    assert_same_state(full_state(trainer), expected)


def test_a_single_process_checkpoint_loads_under_fsdp2_at_3(tmp_path: Path) -> None:
    single = tmp_path / "single.ckpt"
    trainer, _ = run_single(tmp_path, fmt="sharded", max_steps=5, save=single)
    _job(tmp_path / "three", "--strategy", "fsdp2", "--devices", "3", "--format", "sharded", "--resume", str(single), "--max-steps", "5")  # fmt: skip
    assert_same_state(_final(tmp_path / "three"), full_state(trainer))


def test_two_optimizers_resume_exactly(tmp_path: Path) -> None:
    args = ["--strategy", "fsdp2", "--format", "sharded", "--optimizers", "2"]
    _job(tmp_path / "straight", *args, "--max-steps", "6", "--save-every", "3", "--keep", "-1")
    ckpt = tmp_path / "straight" / "ckpts" / "epoch=0-step=3.ckpt"
    _job(tmp_path / "resumed", *args, "--max-steps", "6", "--resume", str(ckpt))
    assert_same_state(_final(tmp_path / "resumed"), _final(tmp_path / "straight"))
