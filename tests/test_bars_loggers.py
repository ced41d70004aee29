"""Progress bars, the model summary and loggers against Lightning 2.6.6 (tests/twins/bars_loggers.py),
and, where the Lightning environment lacks a package that fullshard's has (``rich``,
``tensorboard``), fullshard against Lightning's rule read from its source."""

from __future__ import annotations

import os
import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import compare
import fullshard as L
from fullshard.callbacks import (
    ModelCheckpoint,
    ModelSummary,
    RichModelSummary,
    RichProgressBar,
    TQDMProgressBar,
)
from fullshard.loggers import TensorBoardLogger

twins = compare.Twins("bars_loggers.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> compare.Runs:
    return twins.run(tmp_path_factory.mktemp("twins"))


@pytest.mark.parametrize("case", [c for c in twins.cases if c != "case_tqdm_bar"])
def test_same_as_lightning(runs: compare.Runs, case: str) -> None:
    compare.same(runs, case)


def test_tqdm_bar_same_as_lightning(runs: compare.Runs) -> None:
    """The screen after fit with each TQDMProgressBar setting. One difference, Lightning's bug:
    with ``leave=True`` Lightning leaves the empty ``Training`` bar it opened in
    ``on_train_start`` and replaced at the first epoch on screen above the epochs' bars;
    fullshard draws no such bar (docs/lightning.md, ``callbacks.TQDMProgressBar``)."""
    lit = runs.lightning["case_tqdm_bar"]
    stale = lit["leave"]["bars"][0]
    assert stale[1:] == ["Training", None, []], lit["leave"]
    lit["leave"]["bars"] = [[row - 1, *rest] for row, *rest in lit["leave"]["bars"][1:]]
    compare.same(runs, "case_tqdm_bar")


# ------------------------------------------------------------------ with rich and tensorboard


def test_rich_installed_gives_rich_defaults(tmp_path: Path) -> None:
    """Lightning's rule (trainer/connectors/callback_connector.py): with rich importable the
    default bar is a RichProgressBar and the default summary a RichModelSummary."""
    trainer = L.Trainer(default_root_dir=tmp_path, logger=False)
    assert [type(cb) for cb in trainer.callbacks] == [RichProgressBar, RichModelSummary, ModelCheckpoint]
    assert trainer.progress_bar_callback is trainer.callbacks[0]
    given = L.Trainer(default_root_dir=tmp_path, logger=False, callbacks=[TQDMProgressBar(), ModelSummary()])
    assert [type(cb) for cb in given.callbacks] == [TQDMProgressBar, ModelSummary, ModelCheckpoint]


def test_rich_bar_flags_follow_lightnings() -> None:
    bar = RichProgressBar(refresh_rate=0)
    assert (bar.is_enabled, bar.is_disabled) == (False, True)
    bar.enable()
    assert bar.is_disabled  # refresh_rate=0 keeps it hidden, as Lightning's
    bar = RichProgressBar()
    bar.disable()
    assert (bar.is_enabled, bar.is_disabled) == (False, True)
    bar.enable()
    assert (bar.is_enabled, bar.is_disabled) == (True, False)


class _Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 2)
        self.example_input_array = torch.zeros(1, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self(batch[0]).sum()
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_tensorboard_installed_makes_it_the_default_logger(tmp_path: Path) -> None:
    """Lightning's rule (logger_connector.py): TensorBoard when installed, in
    ``default_root_dir/lightning_logs/version_N``, without the CSV warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "uses a CSVLogger" warning
        trainer = L.Trainer(default_root_dir=tmp_path, enable_progress_bar=False, enable_model_summary=False)
    assert type(trainer.logger) is TensorBoardLogger
    assert trainer.log_dir == str(tmp_path / "lightning_logs" / "version_0")
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(4, 3)), batch_size=2)
    trainer = L.Trainer(
        default_root_dir=tmp_path, max_steps=2, enable_progress_bar=False, enable_model_summary=False
    )
    trainer.fit(_Net(), data)
    assert any(
        p.name.startswith("events.out.tfevents") for p in (tmp_path / "lightning_logs/version_0").iterdir()
    )
    assert (tmp_path / "lightning_logs/version_0/checkpoints").is_dir()


def _events(folder: str) -> tuple[list[str], bool]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars: list[str] = []
    graph = False
    for name in sorted(os.listdir(folder)):
        if "tfevents" in name:
            events = EventAccumulator(os.path.join(folder, name))
            events.Reload()
            scalars += events.Tags()["scalars"]
            graph = graph or events.Tags()["graph"]
    return scalars, graph


def test_tensorboard_log_graph_without_a_trainer(tmp_path: Path) -> None:
    logger = TensorBoardLogger(tmp_path, log_graph=True)
    logger.log_graph(_Net())  # its example_input_array
    logger.log_graph(_Net(), torch.ones(2, 3))
    logger.finalize("success")
    assert _events(logger.log_dir)[1]


class _Named(TensorBoardLogger):
    @property
    def name(self) -> str:
        return "custom"

    @property
    def version(self) -> str:
        return "v7"


def test_tensorboard_subclass_name_and_version_and_pickling(tmp_path: Path) -> None:
    logger = _Named(tmp_path)
    assert (logger.root_dir, logger.log_dir) == (str(tmp_path / "custom"), str(tmp_path / "custom" / "v7"))
    logger.log_metrics({"a": 1.0}, step=0)
    copy = pickle.loads(pickle.dumps(logger))  # the writer is left behind and made anew
    copy.log_metrics({"b": 2.0}, step=1)
    copy.finalize("success")
    logger.finalize("success")
    assert sorted(_events(logger.log_dir)[0]) == ["a", "b"]
