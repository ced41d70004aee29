"""Trainer and module behaviours Lightning's own tests pin, compared with Lightning 2.6.6 (issue 36):
``self.log`` reductions and the ``"step"`` key, step values logged in evaluation, what
``save_hyperparameters`` records and sends, validation switched off, ``trainer.state``, the
``weights_only=`` keyword, Ctrl+C during ``fit`` and the ``ModelCheckpoint`` checks. The cases are
in tests/twins/trainer_pins.py."""

from __future__ import annotations

import pytest

import compare

twins = compare.Twins("trainer_pins.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> compare.Runs:
    return twins.run(tmp_path_factory.mktemp("twins"))


@compare.needs_lightning
@pytest.mark.parametrize("case", twins.cases)
def test_same_as_lightning(runs: compare.Runs, case: str) -> None:
    compare.same(runs, case)
