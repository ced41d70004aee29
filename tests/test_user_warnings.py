"""The warnings a Lightning user sees, against Lightning 2.6.6 (tests/twins/user_warnings.py):
the same category, under the same conditions, as many times (issue 38); and fullshard's words
for them, pinned."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import compare
import fullshard
from conftest import quiet_trainer
from fullshard.utilities.warnings import PossibleUserWarning

twins = compare.Twins("user_warnings.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> compare.Runs:
    return twins.run(tmp_path_factory.mktemp("twins"))


@compare.needs_lightning
@pytest.mark.parametrize("case", twins.cases)
def test_same_as_lightning(runs: compare.Runs, case: str) -> None:
    compare.same(runs, case)


def test_possible_user_warning_is_a_user_warning_at_lightnings_path() -> None:
    from fullshard.lightning_aliases import fullshard_path

    assert issubclass(PossibleUserWarning, UserWarning)
    assert fullshard_path("lightning.pytorch.utilities.warnings") == "fullshard.utilities.warnings"


class _Net(fullshard.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("loss", loss, logger=True)
        return loss

    def predict_step(self, batch: Any, batch_idx: int) -> None:
        return None

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader(n: int) -> DataLoader[Any]:
    return DataLoader(TensorDataset(torch.zeros(n, 4)), batch_size=4)


def test_the_messages_say_what_to_do(tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trainer = quiet_trainer(tmp_path, max_epochs=1)
        trainer.fit(_Net(), _loader(8))
        trainer.predict(_Net(), _loader(4))
        trainer.fit(_Net(), _loader(0))
    said = "\n".join(str(w.message) for w in seen)
    assert (
        "self.log('loss', ..., logger=True) was called but the Trainer has no logger configured, so the "
        "value reaches no logger. Pass Trainer(logger=...) (a CSVLogger, say) to record it." in said
    )
    assert "predict_step returned None for a batch, so its prediction is None" in said
    assert (
        "The train dataloader has length zero (DataLoader of no batches): nothing of it runs. Make sure "
        "this is intended (an empty dataset? drop_last=True with fewer samples than batch_size?)." in said
    )
