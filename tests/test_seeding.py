"""Random-number streams as Lightning 2.6.6's (tests/twins/seeding.py under both): the
distributed strategies seed again from ``seed_everything``'s record when a process joins the job.

Under FSDP, FSDP2 and model parallel (which Lightning runs only on GPUs) the re-seeding is the
same code as under DDP (``ParallelStrategy.setup_environment``); the parity tests of those
strategies (tests/test_fsdp_parity.py, tests/test_model_parallel.py) run with it.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import compare
import fullshard
from conftest import check_ok, run_script
from fullshard.callbacks import ModelCheckpoint
from fullshard.errors import CorruptCheckpointError
from fullshard.seed import reset_seed
from fullshard.trainer.loops.progress import Progress

twins = compare.Twins("seeding.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> compare.Runs:
    return twins.run(tmp_path_factory.mktemp("twins"))


@compare.needs_lightning
@pytest.mark.parametrize("case", twins.cases)
def test_same_as_lightning(runs: compare.Runs, case: str) -> None:
    compare.same(runs, case)


def test_reset_seed_seeds_as_seed_everything_did() -> None:
    fullshard.seed_everything(8)
    first = (torch.rand(3), random.random())
    torch.rand(7)
    reset_seed()
    again = (torch.rand(3), random.random())
    assert torch.equal(first[0], again[0]) and first[1] == again[1]


class _Dropout(fullshard.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 16), torch.nn.Dropout(0.3), torch.nn.ReLU(), torch.nn.Linear(16, 1)
        )
        self.losses: list[float] = []
        self.samples: list[list[float]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        self.samples.append(x[:, 0].tolist())
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _data(n: int, seed: int) -> DataLoader[Any]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=6, shuffle=n > 12)


def _fit(root: Path, max_steps: int, ckpt_path: Path | None = None, sampler: bool = True) -> _Dropout:
    fullshard.seed_everything(3)
    model = _Dropout()
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        val_check_interval=4,
        limit_val_batches=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        use_distributed_sampler=sampler,
        callbacks=[ModelCheckpoint(dirpath=root, every_n_train_steps=5, save_top_k=-1)],
    )
    trainer.fit(model, _data(40, 1), _data(12, 2), ckpt_path=ckpt_path)
    return model


@pytest.mark.parametrize(
    ("cut", "sampler"),
    # inside the first epoch (7 batches), inside the second; the loader as given (its own
    # RandomSampler, replayed up to the cut)
    [(5, True), (10, True), (5, False)],
)
def test_a_shuffled_loader_resumes_mid_epoch_as_the_uninterrupted_run(
    tmp_path: Path, cut: int, sampler: bool
) -> None:
    """On one device a ``shuffle=True`` loader's order is drawn from the global generator (as
    Lightning's RandomSampler); a run resumed inside an epoch still trains on the rest of that
    epoch's order, with the dropout masks, validation and later orders of the uninterrupted run."""
    whole = _fit(tmp_path / "whole", 16, sampler=sampler)
    first = _fit(tmp_path / "first", cut, sampler=sampler)
    (ckpt,) = (tmp_path / "first").glob(f"*step={cut}.ckpt")
    resumed = _fit(tmp_path / "resumed", 16, ckpt_path=ckpt, sampler=sampler)
    assert first.samples + resumed.samples == whole.samples
    assert first.losses + resumed.losses == whole.losses
    for a, b in zip(whole.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)
    orders = [sorted(x for batch in whole.samples[k : k + 7] for x in batch) for k in (0, 7)]
    assert orders[0] == orders[1] and whole.samples[:7] != whole.samples[7:14]  # shuffled anew per epoch


@pytest.mark.multiprocess
def test_ddp_with_dropout_and_a_shuffled_loader_draws_as_lightning(tmp_path: Path) -> None:
    """2 processes of DDP with dropout, a shuffled loader and validation: every rank's loss per
    step, validation losses, the draw in ``setup`` (after the re-seeding) and the final weights
    equal Lightning's (recorded once: the command is in tests/scripts/seeding_ddp_job.py)."""
    check_ok(run_script("seeding_ddp_job.py", "--out", str(tmp_path), timeout=240))
    ours = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert compare.close(ours, json.loads(_LIGHTNING_DDP.read_text()), rel=1e-5)


_LIGHTNING_DDP = Path(__file__).parent / "fixtures" / "seeding_ddp_lightning.json"


@pytest.mark.parametrize(("value", "got"), [(b"x", "bytes of 1 bytes"), ([1, 2], "list")])
def test_a_damaged_epoch_state_is_refused(value: Any, got: str) -> None:
    state = Progress().state_dict(None, 0)
    state["epoch_rng_state"] = value
    with pytest.raises(
        CorruptCheckpointError,
        match=rf"loops\['epoch_rng_state'\] is not a random-number generator state \(5056 bytes\), got {got}\. "
        r"Resume from a checkpoint written by Trainer.save_checkpoint\(\)",
    ):
        Progress().load_state_dict(state)
