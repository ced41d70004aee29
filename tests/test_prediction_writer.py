"""``BasePredictionWriter``: per-batch and per-epoch writing with the dataset indices of each
batch, on one process and on two without gathering (``return_predictions=False``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from conftest import SCRIPTS, check_ok, quiet_trainer, run_script
from fullshard.callbacks import BasePredictionWriter
from fullshard.errors import MisconfigurationError

sys.path.insert(0, str(SCRIPTS))
from prediction_writer_job import Doubler, Writer, make_data


def _expected(n: int) -> torch.Tensor:
    with torch.no_grad():
        return Doubler().layer(make_data(n).tensors[0])


def test_lightning_import_path() -> None:
    # Lightning's module path, from the alias table (fullshard.lightning_paths)
    import fullshard.callbacks.prediction_writer as module

    assert module.BasePredictionWriter is BasePredictionWriter


def test_write_interval_is_checked() -> None:
    with pytest.raises(
        MisconfigurationError,
        match=r"write_interval='step'\): write_interval must be one of 'batch', 'epoch', 'batch_and_epoch'",
    ):
        BasePredictionWriter("step")  # type: ignore[arg-type]


def test_a_writer_without_its_write_method_says_which_to_define(tmp_path: Path) -> None:
    with pytest.raises(
        NotImplementedError, match=r"BasePredictionWriter writes per batch.*define write_on_batch_end"
    ):
        quiet_trainer(tmp_path, callbacks=[BasePredictionWriter("batch")]).predict(
            Doubler(), DataLoader(make_data(4), batch_size=2)
        )


@pytest.mark.parametrize("interval", ["batch", "epoch", "batch_and_epoch"])
def test_one_process_writes_what_its_interval_says(tmp_path: Path, interval: Any) -> None:
    trainer = quiet_trainer(tmp_path, callbacks=[Writer(tmp_path, interval)])
    returned = trainer.predict(Doubler(), DataLoader(make_data(7), batch_size=3), return_predictions=False)
    assert returned is None
    batches = sorted(tmp_path.glob("batch_*.pt"))
    epoch = tmp_path / "epoch_0.pt"
    assert bool(batches) == (interval != "epoch") and epoch.exists() == (interval != "batch")
    expected = _expected(7)
    if batches:
        written = [torch.load(tmp_path / f"batch_0_0_{i}.pt") for i in range(3)]
        assert [w["indices"] for w in written] == [[0, 1, 2], [3, 4, 5], [6]]
        assert torch.allclose(torch.cat([w["prediction"] for w in written]), expected)
    if epoch.exists():
        saved = torch.load(epoch)
        assert saved["indices"] == [[[0, 1, 2], [3, 4, 5], [6]]]  # one list per dataloader, as Lightning
        assert torch.allclose(torch.cat(saved["predictions"]), expected)
    # the predictions kept for the epoch writer are not returned nor kept after the run
    assert trainer.predict_loop.predictions == []


def test_shuffled_batches_report_the_indices_they_hold(tmp_path: Path) -> None:
    trainer = quiet_trainer(tmp_path, callbacks=[Writer(tmp_path, "batch")])
    data = make_data(9)
    torch.manual_seed(3)
    trainer.predict(Doubler(), DataLoader(data, batch_size=4, shuffle=True), return_predictions=False)
    written = [torch.load(tmp_path / f"batch_0_0_{i}.pt") for i in range(3)]
    indices = [j for w in written for j in w["indices"]]
    assert sorted(indices) == list(range(9)) and indices != list(range(9))  # shuffled, all there
    assert torch.allclose(torch.cat([w["prediction"] for w in written]), _expected(9)[indices])


def test_returned_predictions_are_kept_as_well(tmp_path: Path) -> None:
    trainer = quiet_trainer(tmp_path, callbacks=[Writer(tmp_path, "batch")])
    returned = trainer.predict(Doubler(), DataLoader(make_data(4), batch_size=2))
    assert torch.allclose(torch.cat(returned), _expected(4))


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_processes_write_their_shares_without_gathering(tmp_path: Path, strategy: str) -> None:
    check_ok(
        run_script(
            "prediction_writer_job.py",
            "--out",
            str(tmp_path),
            "--strategy",
            strategy,
            "--loaders",
            "2",
            timeout=180,
        )
    )
    for i, n in enumerate((13, 17)):
        expected = _expected(n)
        indices: list[int] = []
        for rank in range(2):
            files = sorted(tmp_path.glob(f"batch_{i}_{rank}_*.pt"), key=lambda p: int(p.stem.split("_")[-1]))
            written = [torch.load(f) for f in files]
            rank_indices = [j for w in written for j in w["indices"]]
            assert rank_indices == _rank_share(n, rank)
            assert torch.allclose(torch.cat([w["prediction"] for w in written]), expected[rank_indices])
            epoch = torch.load(tmp_path / f"epoch_{rank}.pt")
            assert [j for b in epoch["indices"][i] for j in b] == rank_indices
            indices += rank_indices
        assert set(indices) == set(range(n))  # both ranks together cover the dataset
    for rank in range(2):
        assert json.loads((tmp_path / f"returned_{rank}.json").read_text()) is None


def _rank_share(n: int, rank: int) -> list[int]:
    """``DistributedSampler``'s split of ``range(n)`` over 2 ranks (padded from the start)."""
    order = list(range(n)) + list(range(n))[: n % 2]
    return order[rank::2]


def test_an_epoch_writer_without_write_on_epoch_end_says_so(tmp_path: Path) -> None:
    with pytest.raises(
        NotImplementedError, match=r"writes per epoch \(write_interval='epoch'\).*define write_on_epoch_end"
    ):
        quiet_trainer(tmp_path, callbacks=[BasePredictionWriter("epoch")]).predict(
            Doubler(), DataLoader(make_data(4), batch_size=2)
        )


class _Stream(torch.utils.data.IterableDataset[Any]):
    def __iter__(self) -> Any:
        return iter([torch.ones(4), torch.zeros(4)])


def test_an_iterable_dataset_gives_empty_batch_indices_with_a_warning(tmp_path: Path) -> None:
    class Keep(BasePredictionWriter):
        def __init__(self) -> None:
            super().__init__("batch")
            self.indices: list[Any] = []

        def write_on_batch_end(
            self, trainer: Any, pl_module: Any, prediction: Any, batch_indices: Any, *rest: Any
        ) -> None:
            self.indices.append(batch_indices)

    class Model(Doubler):
        def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
            return self.layer(batch)

    keep = Keep()
    with pytest.warns(
        UserWarning, match=r"gets no batch_indices from a prediction dataloader \(an iterable dataset\)"
    ):
        quiet_trainer(tmp_path, callbacks=[keep]).predict(Model(), DataLoader(_Stream(), batch_size=1))
    assert keep.indices == [[], []]
