"""Data loading as Lightning 2.6.6's (tests/twins/data_loading.py under both), and fullshard's
own options around it: ``use_distributed_sampler="keep_shuffle"``.

The 2-process order of the default sampler is checked in tests/test_resume_world_size.py
(``test_the_default_sampler_shuffles_an_unshuffled_loader_as_lightning``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import compare
import fullshard
from conftest import quiet_trainer
from fullshard.errors import MisconfigurationError

twins = compare.Twins("data_loading.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> compare.Runs:
    return twins.run(tmp_path_factory.mktemp("twins"))


@compare.needs_lightning
@pytest.mark.parametrize("case", twins.cases)
def test_same_as_lightning(runs: compare.Runs, case: str) -> None:
    compare.same(runs, case)


class _Seen(fullshard.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[list[float]] = []

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.seen.append(batch.tolist())
        return self.layer(batch.view(-1, 1)).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.parametrize(("option", "ordered"), [(True, False), ("keep_shuffle", True), (False, True)])
def test_keep_shuffle_keeps_the_training_loaders_order(
    option: Any, ordered: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a distributed strategy the default sampler shuffles a ``shuffle=False`` loader (as
    Lightning's); ``"keep_shuffle"`` and False keep its order."""
    for name in ("MASTER_ADDR", "MASTER_PORT"):  # the one-process DDP run sets them: undone after
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    fullshard.seed_everything(1)
    model = _Seen()
    trainer = fullshard.Trainer(
        accelerator="cpu",
        devices=1,
        strategy="ddp",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=option,
    )
    try:
        trainer.fit(model, DataLoader(torch.arange(12.0), batch_size=4))
    finally:  # the one-process group stays after fit (as Lightning's): not for the next test
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    in_order = [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0], [8.0, 9.0, 10.0, 11.0]]
    assert (model.seen == in_order) is ordered
    assert sorted(x for batch in model.seen for x in batch) == list(range(12))


@pytest.mark.parametrize("value", ["keep", "True", 1, None])
def test_use_distributed_sampler_values(value: Any) -> None:
    with pytest.raises(
        MisconfigurationError,
        match=r"use_distributed_sampler=.* is invalid: use True \(Lightning's sampler: under a distributed "
        r"strategy it shuffles the training data, even from a loader with shuffle=False\), 'keep_shuffle'",
    ):
        fullshard.Trainer(use_distributed_sampler=value)


class _Stream(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """An iterable dataset without a length: the loops fetch it a batch ahead."""

    def __iter__(self) -> Any:
        return iter(torch.arange(10.0).view(5, 2))


class _SeenLast(_Seen):
    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.seen.append([self.current_epoch, batch_idx, self.trainer.is_last_batch, batch.tolist()])
        return self.layer(batch.view(-1, 1)).mean()


def test_an_unsized_loader_fetched_ahead_resumes_exactly(tmp_path: Path) -> None:
    """An iterable dataset fetched a batch ahead: ``is_last_batch`` is True at each epoch's last
    batch, and a run resumed from a mid-epoch checkpoint trains on the batches of the
    uninterrupted run, with the same flags."""

    def fit(tag: str, ckpt: Path | None = None) -> list[Any]:
        fullshard.seed_everything(0)
        model = _SeenLast()
        every = fullshard.ModelCheckpoint(dirpath=tmp_path / tag, every_n_train_steps=7, save_top_k=-1)
        trainer = quiet_trainer(
            tmp_path, max_epochs=3, max_steps=12, callbacks=[every], enable_checkpointing=True
        )
        trainer.fit(model, DataLoader(_Stream(), batch_size=None), ckpt_path=ckpt)
        return model.seen

    whole = fit("whole")  # writes a checkpoint at step 7, in the middle of epoch 1
    assert [r[:3] for r in whole] == [[e, i, i == 4] for e in range(3) for i in range(5)][:12]
    assert whole[:7] + fit("resumed", ckpt=tmp_path / "whole" / "epoch=1-step=7.ckpt") == whole


class _Rebuilt(_Seen):
    """Each ``train_dataloader()`` call gives batches holding its call number."""

    def __init__(self) -> None:
        super().__init__()
        self.builds = 0

    def train_dataloader(self) -> DataLoader[torch.Tensor]:
        self.builds += 1
        return DataLoader(torch.full((4,), float(self.builds)), batch_size=2)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.seen.append([self.current_epoch, self.builds, batch.tolist()])
        return self.layer(batch.view(-1, 1)).mean()


def test_the_first_epoch_reads_the_loader_reloaded_for_it(tmp_path: Path) -> None:
    """Resumed after an epoch ended, with reload_dataloaders_every_n_epochs=1: the first epoch
    rebuilds the loader and reads the rebuilt one (not the iterator made when the fit started)."""
    ckpt = fullshard.ModelCheckpoint(dirpath=tmp_path, save_last=True)
    quiet_trainer(tmp_path, max_epochs=1, callbacks=[ckpt], enable_checkpointing=True).fit(_Rebuilt())
    model = _Rebuilt()
    quiet_trainer(tmp_path, max_epochs=3, reload_dataloaders_every_n_epochs=1).fit(
        model, ckpt_path=tmp_path / "last.ckpt"
    )
    assert model.builds == 3
    assert all(batch == [float(builds)] * 2 for _, builds, batch in model.seen), model.seen
    assert [epoch for epoch, _, _ in model.seen] == [1, 1, 2, 2]
