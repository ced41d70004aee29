"""One model through several Trainers (issue 37): fit, then a new Trainer resumes it from a
checkpoint or fits it again, as a notebook does. The single-process flows are compared with
Lightning 2.6.6 (tests/twins/model_reuse.py); the sharded checkpoint of one process and FSDP1/FSDP2
on 2 processes, which Lightning does not run on CPU, against a fresh model resumed from the same
checkpoint. See [Note: gradients cleared before optimizer states load] in
fullshard/checkpoint/loose_gradients.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import compare
import fullshard
from conftest import check_ok, quiet_trainer, run_script
from fullshard.strategies import SingleDeviceStrategy

twins = compare.Twins("model_reuse.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> compare.Runs:
    return twins.run(tmp_path_factory.mktemp("twins"))


@compare.needs_lightning
@pytest.mark.parametrize("case", twins.cases)
def test_same_as_lightning(runs: compare.Runs, case: str) -> None:
    compare.same(runs, case)


class Tiny(fullshard.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)
        self.losses: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.layer(batch[0]).pow(2).mean()
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=0.1)


def _loader() -> DataLoader[Any]:
    return DataLoader(
        TensorDataset(torch.randn(8, 4, generator=torch.Generator().manual_seed(3))), batch_size=4
    )


def test_a_sharded_checkpoint_resumes_the_optimizer_state_of_a_fitted_model(tmp_path: Path) -> None:
    """Before the fix the reused model resumed with Adam's moments at zero, silently: torch's
    template of the optimizer state was empty while the parameters held gradients."""

    def trainer(steps: int) -> fullshard.Trainer:
        return quiet_trainer(
            tmp_path, max_steps=steps, strategy=SingleDeviceStrategy(state_dict_type="sharded")
        )

    fullshard.seed_everything(0)
    model = Tiny()
    first = trainer(2)
    first.fit(model, _loader())
    first.save_checkpoint(tmp_path / "sharded.ckpt")
    model.losses.clear()
    trainer(4).fit(model, _loader(), ckpt_path=tmp_path / "sharded.ckpt")
    fresh = Tiny()
    trainer(4).fit(fresh, _loader(), ckpt_path=tmp_path / "sharded.ckpt")
    assert len(fresh.losses) == 2 and model.losses == fresh.losses
    assert all(
        p.grad is not None for p in model.parameters()
    )  # the last step's, left as Lightning leaves them


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_fsdp_and_fsdp2_resume_a_fitted_model_in_a_new_trainer(tmp_path: Path) -> None:
    """2 CPU processes, full and sharded checkpoints: the reused model's resumed losses are a fresh
    model's. Before the fix FSDP2 with a full checkpoint failed ("Expected device to be set") and
    both strategies with a sharded one resumed without the optimizer's state."""
    result = run_script("reuse_job.py", str(tmp_path), timeout=170)
    check_ok(result)
    lines = [
        json.loads(line[len("reuse ") :]) for line in result.stdout.splitlines() if line.startswith("reuse ")
    ]
    assert [(r["strategy"], r["format"]) for r in lines] == [
        ("fsdp", "full"),
        ("fsdp", "sharded"),
        ("fsdp2", "full"),
        ("fsdp2", "sharded"),
    ], result.stdout
    for r in lines:
        assert r["steps"] == [2, 4, 1, 4], r
        assert len(r["reused"]) == 2 and r["reused"] == r["fresh"], r
