"""The batch-transfer hooks (``on_before_batch_transfer``, ``transfer_batch_to_device``,
``on_after_batch_transfer``) and ``configure_callbacks``, as Lightning 2.6.6 calls them. Two
processes under DDP and FSDP: the porting script tests/porting/custom_batch.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import fullshard
from conftest import quiet_trainer
from fullshard.batch_transfer import BatchTransfer, move_data_to_device
from fullshard.callbacks import Callback, EarlyStopping, ModelCheckpoint
from fullshard.errors import MisconfigurationError
from fullshard.strategies import SingleDeviceStrategy
from fullshard.trainer.callback_setup import attach_model_callbacks


def _data(n: int = 8) -> DataLoader[Any]:
    return DataLoader(TensorDataset(torch.ones(n, 2), torch.zeros(n)), batch_size=4)


class Plain(fullshard.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 1)
        self.seen: list[Any] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.seen.append(("train", batch))
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.seen.append(("val", batch))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.seen.append(("test", batch))

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        self.seen.append(("predict", batch))
        return batch[0]

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Hooked(Plain):
    """Doubles x before the transfer, adds 1 to y after it, and records each hook's call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, ...]] = []

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        self.calls.append(("before", str(dataloader_idx)))
        return [batch[0] * 2, batch[1]]

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        self.calls.append(("transfer", device.type))
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        self.calls.append(("after", str(dataloader_idx)))
        return [batch[0], batch[1] + 1]


class Probe(SingleDeviceStrategy):
    """Records the batch-transfer hooks the Trainer passes with each batch."""

    def batch_to_device(
        self,
        batch: Any,
        device: torch.device | None = None,
        dataloader_idx: int = 0,
        transfer: Any = "module",
    ) -> Any:
        self.transfers = [*getattr(self, "transfers", []), transfer]
        return super().batch_to_device(batch, device, dataloader_idx, transfer)


def test_the_hooks_run_in_lightnings_order_for_every_stage(tmp_path: Path) -> None:
    model = Hooked()
    trainer = quiet_trainer(tmp_path, max_epochs=1, num_sanity_val_steps=0)
    trainer.fit(model, _data(), _data())
    trainer.test(model, _data())
    trainer.predict(model, _data())
    assert model.calls[:3] == [("before", "0"), ("transfer", "cpu"), ("after", "0")]
    assert len(model.calls) == 3 * (2 + 2 + 2 + 2)  # train, val, test, predict: 2 batches each
    for stage, batch in model.seen:
        assert torch.equal(batch[0], torch.full((4, 2), 2.0)) and torch.equal(batch[1], torch.ones(4)), stage


def test_not_overriding_them_costs_nothing(tmp_path: Path) -> None:
    probe = Probe()
    quiet_trainer(tmp_path, max_epochs=1, strategy=probe).fit(Plain(), _data())
    assert probe.transfers == [None, None]  # passed with each batch: batch_to_device keeps its fast path
    probe = Probe()
    quiet_trainer(tmp_path, max_epochs=1, strategy=probe).fit(Hooked(), _data())
    assert len(probe.transfers) == 2 and all(isinstance(t, BatchTransfer) for t in probe.transfers)
    assert "batch_transfer" not in vars(probe)  # an argument, not state the strategy keeps


class Pair:
    """A user's batch type with a ``.to()``: the default transfer calls it."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x = x
        self.moved_to: list[str] = []

    def to(self, device: Any) -> Pair:
        self.moved_to.append(str(device))
        return self


@dataclasses.dataclass
class Record:
    x: torch.Tensor
    name: str


class InPlace:
    def to(self, device: Any) -> None:  # moves itself, returns nothing
        self.device = device


def test_the_default_transfer_walks_collections_and_calls_to() -> None:
    pair, in_place = Pair(torch.ones(1)), InPlace()
    moved = move_data_to_device({"a": [pair, Record(torch.zeros(2), "r")], "b": (in_place, 3, "s")}, "cpu")
    assert moved["a"][0] is pair and pair.moved_to == ["cpu"]
    assert isinstance(moved["a"][1], Record) and moved["a"][1].name == "r"
    assert moved["b"][0] is in_place and in_place.device == torch.device("cpu") and moved["b"][1:] == (3, "s")


class CustomBatch(Plain):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        assert isinstance(batch, Record)
        return self.layer(batch.x).pow(2).mean()

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        return Record(batch[0].to(device), "custom")


def test_a_custom_batch_type_comes_from_transfer_batch_to_device(tmp_path: Path) -> None:
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(CustomBatch(), _data())
    assert trainer.global_step == 2
    batch = trainer.strategy.batch_to_device([torch.ones(1)], torch.device("cpu"), dataloader_idx=3)
    assert isinstance(batch, Record)


class Data(fullshard.LightningDataModule):
    def train_dataloader(self) -> Any:
        return _data()

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return [batch[0] * 10, batch[1]]


def test_a_datamodules_hook_wins_over_the_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        "fullshard.rank_zero._said_once", set()
    )  # said once per process: forget earlier tests
    model = Hooked()
    with pytest.warns(
        UserWarning, match="overridden `on_before_batch_transfer` in both the Module and the DataModule"
    ):
        quiet_trainer(tmp_path, max_epochs=1).fit(model, datamodule=Data())
    assert ("before", "0") not in model.calls and (
        "transfer",
        "cpu",
    ) in model.calls  # the others: the module's
    assert torch.equal(model.seen[0][1][0], torch.full((4, 2), 10.0)) and torch.equal(
        model.seen[0][1][1], torch.ones(4)
    )


# ------------------------------------------------------------------- configure_callbacks
class Tagged(Callback):
    def __init__(self, tag: str) -> None:
        self.tag = tag


class SubTagged(Tagged):
    pass


class WithCallbacks(Plain):
    def __init__(self, returned: Any) -> None:
        super().__init__()
        self.returned = returned
        self.asked = 0

    def configure_callbacks(self) -> Any:
        self.asked += 1
        return self.returned


def test_configure_callbacks_replaces_the_same_type_and_keeps_checkpoints_last(
    tmp_path: Path, captured: pytest.LogCaptureFixture
) -> None:
    checkpoint, early = ModelCheckpoint(dirpath=tmp_path), EarlyStopping(monitor="x")
    given = [Tagged("trainer"), checkpoint, early]
    module_cb, module_ckpt = SubTagged("module"), ModelCheckpoint(dirpath=tmp_path / "m")
    merged = attach_model_callbacks(given, WithCallbacks([module_cb, module_ckpt]))
    # Lightning: a module callback replaces Trainer callbacks of its type or a parent type
    assert merged == [early, module_cb, module_ckpt]
    assert "override existing callbacks passed to Trainer: ModelCheckpoint, Tagged" in captured.text
    single = Tagged("one")
    assert attach_model_callbacks(given, WithCallbacks(single)) == [early, single, checkpoint]
    assert attach_model_callbacks(given, WithCallbacks([])) is given
    with pytest.raises(
        MisconfigurationError, match=r"configure_callbacks\(\) returned a str; return a fullshard Callback"
    ):
        attach_model_callbacks(given, WithCallbacks(["x"]))


def test_configure_callbacks_is_asked_by_every_call(tmp_path: Path) -> None:
    mine = Tagged("module")
    model = WithCallbacks([mine])
    trainer = quiet_trainer(tmp_path, max_epochs=1, callbacks=[Tagged("trainer")])
    trainer.fit(model, _data())
    trainer.validate(model, _data())
    assert model.asked == 2
    assert [cb for cb in trainer.callbacks if isinstance(cb, Tagged)] == [mine]
