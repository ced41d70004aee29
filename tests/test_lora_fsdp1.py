"""LoRA under ``strategy="fsdp"`` (FSDP1) saves sharded and resumes exactly: a frozen base and a
trained adapter in one FSDP unit, whose adapter lies in the last rank's flat shard only (the
other ranks' optimizers hold no state: [Note: FSDP1 ranks without a trained parameter] in
fullshard/strategies/optimizer_state.py). Saved by 2 processes after 3 steps, resumed by 2, by
1 and 3 processes and under fsdp2, and compared with the run that went on (6 steps):
tests/scripts/lora_fsdp1_job.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import check_ok, run_script

pytestmark = pytest.mark.multiprocess

ADAPTER = [f"layers.{i}.lora_{ab}.weight" for i in (0, 2) for ab in "ab"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """6 steps under fsdp with 2 processes, saving sharded after the first epoch (3 steps)."""
    out = tmp_path_factory.mktemp("lora")
    check_ok(run_script("lora_fsdp1_job.py", "--out", str(out), "--phase", "straight", "--devices", "2"))
    return out


def resumed(out: Path, strategy: str, devices: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Resume from the straight run's checkpoint: (the straight run's snapshots, the resumed run's)."""
    args = ["--out", str(out), "--phase", "resume", "--strategy", strategy, "--devices", str(devices)]
    check_ok(run_script("lora_fsdp1_job.py", *args))
    return (
        torch.load(out / "straight-fsdp-2.pt", weights_only=True),
        torch.load(out / f"resume-{strategy}-{devices}.pt", weights_only=True),
    )


def tensors(snapshot: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The parameters and the optimizer's state of a snapshot, flat."""
    flat = {f"param {k}": v for k, v in snapshot["params"].items()}
    for key, state in snapshot["optimizer"].items():
        flat.update({f"optimizer {key} {name}": value for name, value in state.items()})
    return flat


def check_same(expected: dict[str, Any], got: dict[str, Any], *, exact: bool) -> None:
    want, have = tensors(expected), tensors(got)
    assert sorted(have) == sorted(want)
    for key, value in want.items():
        if exact:
            assert torch.equal(have[key], value), key
        else:  # another number of processes adds the gradients in another order
            torch.testing.assert_close(have[key], value, rtol=1e-5, atol=1e-6, msg=key)


def test_the_straight_run_trains_the_adapter_only(straight: Path) -> None:
    run = torch.load(straight / "straight-fsdp-2.pt", weights_only=True)
    assert run["global_step"] == 6
    # the optimizer holds AdamW's state of each adapter weight, whole (every rank's part was saved)
    assert sorted(run["epoch0"]["optimizer"]) == ADAPTER
    for key, state in run["epoch0"]["optimizer"].items():
        assert state["step"].item() == 3
        assert state["exp_avg"].shape == run["epoch0"]["params"][key].shape
        assert state["exp_avg"].abs().sum() > 0
    moved = [k for k in ADAPTER if not torch.equal(run["end"]["params"][k], run["epoch0"]["params"][k])]
    assert moved == ADAPTER
    frozen = [k for k in run["end"]["params"] if k not in ADAPTER]
    assert all(torch.equal(run["end"]["params"][k], run["epoch0"]["params"][k]) for k in frozen)


def test_resumes_exactly_with_the_same_processes(straight: Path) -> None:
    expected, got = resumed(straight, "fsdp", 2)
    assert got["global_step"] == 6
    check_same(expected["epoch0"], got["epoch0"], exact=True)  # as saved
    check_same(expected["end"], got["end"], exact=True)  # and goes on as the run that did not stop


@pytest.mark.parametrize(
    ("strategy", "devices"),
    [("auto", 1), ("fsdp", 3), ("fsdp2", 2)],
)
def test_resumes_with_other_processes(straight: Path, strategy: str, devices: int) -> None:
    """One process, 3 (two of them holding none of the adapter) and fsdp2 read the same files."""
    expected, got = resumed(straight, strategy, devices)
    assert got["global_step"] == 6
    check_same(expected["epoch0"], got["epoch0"], exact=True)
    check_same(expected["end"], got["end"], exact=False)
