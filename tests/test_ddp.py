"""Multi-process DDP on CPU (gloo): parity with one process, resume equivalence, failures."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

import fullshard
from ckpt_helpers import run_scenarios
from conftest import SCRIPTS, check_ok, run_script

sys.path.insert(0, str(SCRIPTS))
from train_mlp import MLP, make_data

pytestmark = pytest.mark.multiprocess


def _reference_params(steps: int, batch_size: int) -> dict[str, torch.Tensor]:
    fullshard.seed_everything(7)
    model = MLP()
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
    )
    trainer.fit(model, DataLoader(make_data(), batch_size=batch_size))
    return model.state_dict()


def test_ddp_two_processes_match_single_process(tmp_path: Path) -> None:
    """Two ranks with batch 8 each average gradients like one process with batch 16 (no shuffle:
    rank 0 reads samples 0, 2, 4, ..., rank 1 reads 1, 3, 5, ..., together the same 16 samples)."""
    check_ok(run_script("train_mlp.py", "--out", str(tmp_path), "--devices", "2", "--max-steps", "10"))
    ddp = torch.load(tmp_path / "params.pt")
    reference = _reference_params(steps=10, batch_size=16)
    assert json.loads((tmp_path / "progress.json").read_text())["world_size"] == 2
    for key, value in reference.items():
        # float32 sums in a different order (allreduce vs one batch): tolerance 1e-5
        torch.testing.assert_close(ddp[key], value, rtol=1e-5, atol=1e-5, msg=key)


@pytest.fixture(scope="module")
def straight_ddp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 uninterrupted DDP steps on 2 ranks (shuffling, dropout, a step-wise LR schedule),
    saving a checkpoint every 3 steps; an epoch is 6 steps."""
    out = tmp_path_factory.mktemp("straight_ddp")
    args = ["--strategy", "ddp", "--max-steps", "12", "--save-every", "3", "--keep", "-1"]
    check_ok(run_script("ckpt_job.py", "--out", str(out), *args))
    return out


RESUMES = [(6, "epoch=0-step=6"), (9, "epoch=1-step=9")]


@pytest.fixture(scope="module")
def resumed_ddp(straight_ddp: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """DDP runs to step 12 resumed from each checkpoint of RESUMES, in one job (in turn)."""
    root = tmp_path_factory.mktemp("resumed_ddp")
    args = ["--strategy", "ddp", "--max-steps", "12"]
    ckpts = straight_ddp / "ckpts"
    run_scenarios(
        root,
        [["--out", str(root / name), *args, "--resume", str(ckpts / f"{name}.ckpt")] for _, name in RESUMES],
    )
    return root


@pytest.mark.parametrize(("step", "name"), RESUMES, ids=["epoch-boundary", "mid-epoch"])
def test_resume_is_bitwise_identical(straight_ddp: Path, resumed_ddp: Path, step: int, name: str) -> None:
    assert (straight_ddp / "ckpts" / f"{name}.ckpt").is_file()
    run = resumed_ddp / name  # --strategy ddp --max-steps 12 --resume <name>.ckpt
    for rank in (0, 1):
        expected = json.loads((straight_ddp / f"losses_rank{rank}.json").read_text())
        assert len(expected) == 12
        assert json.loads((run / f"losses_rank{rank}.json").read_text()) == expected[step:], f"rank {rank}"
    a = torch.load(straight_ddp / "final.pt", weights_only=False)
    b = torch.load(run / "final.pt", weights_only=False)
    assert b["global_step"] == 12
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key


@pytest.mark.parametrize("rank", [1, 0])
def test_failing_rank_ends_the_job(tmp_path: Path, rank: int) -> None:
    args = ["--devices", "2", "--max-steps", "50", "--fail-at", "3", "--fail-rank", str(rank)]
    result = run_script("train_mlp.py", "--out", str(tmp_path), *args, timeout=120)
    # timed from the failure (train_mlp.py writes the time as it raises), not from the start: a
    # loaded machine slows the start-up, and what is checked is that nothing waits on the dead rank
    elapsed = time.time() - float((tmp_path / f"failed_rank{rank}").read_text())
    assert result.returncode != 0
    assert f"ValueError: boom on rank {rank}" in result.stderr
    assert "Traceback" in result.stderr
    assert elapsed < 30, f"the job took {elapsed:.1f}s to end after the failure"
    assert not (tmp_path / "params.pt").exists()


@pytest.mark.parametrize("strategy", ["ddp_spawn", "fsdp_spawn"])
def test_spawn_brings_the_trained_weights_back(tmp_path: Path, strategy: str) -> None:
    from fullshard.strategies import FSDPStrategy

    fullshard.seed_everything(7)
    model = MLP()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    chosen = FSDPStrategy(start_method="spawn") if strategy == "fsdp_spawn" else strategy
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=chosen,
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, DataLoader(make_data(), batch_size=8))
    assert trainer.global_step == 3 and "train_loss" in trainer.callback_metrics
    after = model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
