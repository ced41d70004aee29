"""Several validation/test/predict dataloaders (Lightning's "sequential" mode) and the module's
eval/train hooks of the evaluation loops."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import fullshard
from conftest import quiet_trainer
from fullshard.callbacks import Callback
from fullshard.errors import MisconfigurationError
from fullshard.utilities import CombinedLoader


def loader(n: int, seed: int = 0, batch_size: int = 4) -> DataLoader[Any]:
    g = torch.Generator().manual_seed(seed)
    return DataLoader(
        TensorDataset(torch.randn(n, 3, generator=g), torch.randn(n, 1, generator=g)), batch_size=batch_size
    )


class Model(fullshard.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)
        self.calls: list[tuple[str, int, int | None]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.calls.append(("val", batch_idx, dataloader_idx))
        self.log("loss", float(10 * dataloader_idx + batch_idx))
        self.log(f"seen_{dataloader_idx}", 1.0, reduce_fx="sum", add_dataloader_idx=False)

    def on_validation_epoch_end(self) -> None:
        self.log("at_end", 7.0)

    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.log("t", float(dataloader_idx))

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        return (dataloader_idx, batch_idx, len(batch[0]))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("container", [list, tuple, "dict"])
def test_validate_runs_each_loader_and_returns_a_dict_per_loader(tmp_path: Path, container: Any) -> None:
    loaders = [loader(8), loader(12)]
    given = {"a": loaders[0], "b": loaders[1]} if container == "dict" else container(loaders)
    model = Model()
    trainer = quiet_trainer(tmp_path)
    results = trainer.validate(model, given, verbose=False)
    # Lightning 2.6: the step-logged values per loader, the epoch-end ones in every dict
    assert results == [
        {"loss/dataloader_idx_0": 0.5, "seen_0": 2.0, "at_end": 7.0},
        {"loss/dataloader_idx_1": 11.0, "seen_1": 3.0, "at_end": 7.0},
    ]
    assert model.calls == [("val", 0, 0), ("val", 1, 0), ("val", 0, 1), ("val", 1, 1), ("val", 2, 1)]
    assert trainer.num_val_batches == [2, 3]


def test_one_loader_in_a_list_gets_no_index_and_no_suffix(tmp_path: Path) -> None:
    model = Model()
    results = quiet_trainer(tmp_path).validate(model, [loader(8)], verbose=False)
    assert results == [{"loss": 0.5, "seen_0": 2.0, "at_end": 7.0}]
    assert [c[2] for c in model.calls] == [0, 0]  # the default: no dataloader_idx was passed


def test_limits_and_sanity_steps_apply_per_loader(tmp_path: Path) -> None:
    model = Model()
    trainer = quiet_trainer(tmp_path, max_epochs=1, limit_val_batches=2, num_sanity_val_steps=1)
    trainer.fit(model, loader(8), [loader(16), loader(4)])
    sanity, validation = model.calls[:2], model.calls[2:]
    assert sanity == [("val", 0, 0), ("val", 0, 1)]
    assert validation == [("val", 0, 0), ("val", 1, 0), ("val", 0, 1)]
    assert trainer.num_val_batches == [2, 1] and trainer.num_sanity_val_batches == [1, 1]
    assert float(trainer.callback_metrics["loss/dataloader_idx_0"]) == 0.5


def test_the_batch_hooks_get_the_index_only_with_several_loaders(tmp_path: Path) -> None:
    class Hooks(Callback):
        def __init__(self) -> None:
            self.seen: list[tuple[Any, ...]] = []

        def on_test_batch_start(
            self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, *rest: Any
        ) -> None:
            self.seen.append(("start", batch_idx, *rest))

        def on_test_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, *rest: Any
        ) -> None:
            self.seen.append(("end", batch_idx, *rest))

    hooks = Hooks()
    trainer = quiet_trainer(tmp_path, callbacks=[hooks])
    assert trainer.test(Model(), [loader(4), loader(4)], verbose=False) == [
        {"t/dataloader_idx_0": 0.0},
        {"t/dataloader_idx_1": 1.0},
    ]
    assert hooks.seen == [("start", 0, 0), ("end", 0, 0), ("start", 0, 1), ("end", 0, 1)]
    hooks.seen.clear()
    trainer.test(Model(), loader(4), verbose=False)
    assert hooks.seen == [("start", 0), ("end", 0)]


def test_predict_returns_a_list_per_loader(tmp_path: Path) -> None:
    trainer = quiet_trainer(tmp_path)
    assert trainer.predict(Model(), [loader(8), loader(4)]) == [[(0, 0, 4), (0, 1, 4)], [(1, 0, 4)]]
    assert trainer.num_predict_batches == [2, 1]
    assert trainer.predict(Model(), {"only": loader(6)}) == [(0, 0, 4), (0, 1, 2)]


def test_a_step_without_dataloader_idx_is_refused_with_several_loaders(tmp_path: Path) -> None:
    class NoIndex(Model):
        def validation_step(self, batch: Any, batch_idx: int) -> None:  # type: ignore[override]
            pass

    with pytest.raises(
        RuntimeError,
        match=r"multiple `val_dataloader`, but no `dataloader_idx` argument in `NoIndex.validation_step\(\)`",
    ):
        quiet_trainer(tmp_path).validate(NoIndex(), [loader(4), loader(4)])


def test_a_required_dataloader_idx_is_refused_with_one_loader(tmp_path: Path) -> None:
    class Required(Model):
        def on_validation_batch_end(
            self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int
        ) -> None:  # type: ignore[override]
            pass

    with pytest.raises(
        RuntimeError,
        match=r"only a single `val_dataloader`, but have included `dataloader_idx` in `Required.on_validation_batch_end\(\)`",
    ):
        quiet_trainer(tmp_path).validate(Required(), loader(4))


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ([loader(4), "data"], r"got a str in the list. Wrap each dataset"),
        ({"a": 3}, r"got a int in the dict"),
        ("data", r"got str"),
    ],
)
def test_bad_evaluation_loaders_are_refused_before_any_process_starts(
    tmp_path: Path, given: Any, message: str
) -> None:
    with pytest.raises(MisconfigurationError, match=message):
        quiet_trainer(tmp_path).test(Model(), given)


def test_training_loaders_that_cannot_be_combined_are_refused(tmp_path: Path) -> None:
    """Several training loaders train together (tests/test_data_loading.py); ``sequential``
    (as in Lightning) and a collection holding something else than dataloaders are refused."""
    with pytest.raises(
        ValueError, match=r'fit does not support the CombinedLoader\(mode="sequential"\) mode'
    ):
        quiet_trainer(tmp_path).fit(Model(), CombinedLoader([loader(4), loader(4)], "sequential"))
    with pytest.raises(
        MisconfigurationError,
        match=r"train_dataloaders must be a torch.utils.data.DataLoader, a CombinedLoader, or a dict, list or "
        r"tuple of dataloaders; got a int among them. Wrap each dataset",
    ):
        quiet_trainer(tmp_path).fit(Model(), {"a": loader(4), "b": 3})


def test_the_results_table_has_a_column_per_loader(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    quiet_trainer(tmp_path).validate(Model(), [loader(4), loader(4)])
    lines = capsys.readouterr().out.splitlines()
    assert any("DataLoader 0" in line and "DataLoader 1" in line for line in lines)
    row = next(line for line in lines if line.startswith("loss "))
    assert row.split() == ["loss", "0", "10"]


# ------------------------------------------------------------------ the model's eval/train hooks
class DropoutModel(Model):
    """Keeps dropout on in validation, as a Lightning user does with ``on_validation_model_eval``."""

    def __init__(self) -> None:
        super().__init__()
        self.dropout = torch.nn.Dropout(0.5)
        self.frozen = torch.nn.BatchNorm1d(3).eval()  # a submodule frozen in eval mode
        self.modes: list[tuple[str, bool, bool]] = []

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.modes.append(("val", self.training, self.dropout.training))

    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.modes.append(("test", self.training, self.dropout.training))

    def on_validation_model_eval(self) -> None:
        super().on_validation_model_eval()
        self.dropout.train()


def test_overridden_model_eval_hooks_decide_the_modes(tmp_path: Path) -> None:
    model = DropoutModel()
    trainer = quiet_trainer(
        tmp_path, max_epochs=1, limit_train_batches=1, limit_val_batches=1, num_sanity_val_steps=0
    )
    trainer.fit(model, loader(4), loader(4))
    model.frozen.eval()
    trainer.validate(model, loader(4), verbose=False)
    trainer.test(model, loader(4), verbose=False)
    assert model.modes == [("val", False, True), ("val", False, True), ("test", False, False)]
    # the mode of every submodule is put back: the frozen one stays in eval mode
    assert model.training and model.dropout.training and not model.frozen.training


def test_an_overridden_model_train_hook_replaces_the_restore(tmp_path: Path) -> None:
    class StaysEval(DropoutModel):
        def on_test_model_train(self) -> None:
            self.modes.append(("on_test_model_train", self.training, self.dropout.training))

    model = StaysEval()
    quiet_trainer(tmp_path).test(model, loader(4), verbose=False)
    assert model.modes == [("test", False, False), ("on_test_model_train", False, False)]
    assert not model.training  # the override did not call train()


def test_validation_during_fit_zeroes_gradients_through_the_hook(tmp_path: Path) -> None:
    class Counting(Model):
        zero_grads = 0

        def on_validation_model_zero_grad(self) -> None:
            type(self).zero_grads += 1
            super().on_validation_model_zero_grad()
            assert all(p.grad is None for p in self.parameters())

    trainer = quiet_trainer(
        tmp_path, max_epochs=2, limit_train_batches=2, limit_val_batches=1, num_sanity_val_steps=1
    )
    trainer.fit(Counting(), loader(8), loader(4))
    assert Counting.zero_grads == 2  # once per validation of the fit, not for the sanity run


def test_predict_puts_the_modes_back(tmp_path: Path) -> None:
    class Predicting(DropoutModel):
        def on_predict_model_eval(self) -> None:
            super().on_predict_model_eval()
            self.modes.append(("predict_eval", self.training, self.dropout.training))

    model = Predicting()
    model.train()
    model.frozen.eval()
    quiet_trainer(tmp_path).predict(model, loader(4))
    assert model.modes == [("predict_eval", False, False)]
    assert model.training and not model.frozen.training


def test_a_datamodule_may_return_several_loaders(tmp_path: Path) -> None:
    class Data(fullshard.DataModule):
        def test_dataloader(self) -> Any:
            return {"short": loader(4), "long": loader(8)}

    results = quiet_trainer(tmp_path).test(Model(), datamodule=Data(), verbose=False)
    assert results == [{"t/dataloader_idx_0": 0.0}, {"t/dataloader_idx_1": 1.0}]


def test_the_dataloader_suffix_comes_after_step_and_epoch(tmp_path: Path) -> None:
    class Both(Model):
        def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
            self.log("x", float(batch_idx), on_step=True, on_epoch=True)

    trainer = quiet_trainer(tmp_path)
    results = trainer.validate(Both(), [loader(8), loader(4)], verbose=False)
    # Lightning 2.6 names (the epoch-end hook of Model logs at_end)
    assert results == [
        {"x_epoch/dataloader_idx_0": 0.5, "at_end": 7.0},
        {"x_epoch/dataloader_idx_1": 0.0, "at_end": 7.0},
    ]
    assert sorted(trainer.logged_metrics) == [
        "at_end",
        "x_epoch/dataloader_idx_0",
        "x_epoch/dataloader_idx_1",
        "x_step/dataloader_idx_0",
        "x_step/dataloader_idx_1",
    ]
    assert float(trainer.callback_metrics["x/dataloader_idx_0"]) == 0.5


def test_evaluation_step_values_reach_loggers_and_the_bar_not_the_monitors(tmp_path: Path) -> None:
    class StepOnly(Model):
        def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
            self.log("s", float(batch_idx), on_step=True, on_epoch=False, prog_bar=True)

    trainer = quiet_trainer(tmp_path)
    trainer.validate(StepOnly(), loader(8), verbose=False)
    # Lightning 2.6: callback_metrics (what ModelCheckpoint/EarlyStopping read) hold epoch values only
    assert "s" not in trainer.callback_metrics
    assert float(trainer.logged_metrics["s"]) == 1.0 and trainer.progress_bar_metrics["s"] == 1.0


def test_one_name_from_two_loaders_without_the_suffix_is_refused(tmp_path: Path) -> None:
    class Shared(Model):
        def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
            self.log("loss", 1.0, add_dataloader_idx=False)

    with pytest.raises(
        MisconfigurationError,
        match=r"log\('loss', add_dataloader_idx=False\) was called from dataloader 0 and dataloader 1",
    ):
        quiet_trainer(tmp_path).validate(Shared(), [loader(4), loader(4)])
    # the next run counts afresh: one loader is fine
    assert quiet_trainer(tmp_path).validate(Shared(), [loader(4)], verbose=False) == [
        {"loss": 1.0, "at_end": 7.0}
    ]


def test_the_batch_transfer_hooks_get_the_loader_index(tmp_path: Path) -> None:
    class Transfer(Model):
        def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            self.calls.append(("transfer", 0, dataloader_idx))
            return batch

    model = Transfer()
    quiet_trainer(tmp_path).test(model, [loader(4), loader(4)], verbose=False)
    assert [c[2] for c in model.calls if c[0] == "transfer"] == [0, 1]
