"""The tuner compared with Lightning 2.6.6 (tests/twins/tuner.py): the validation loaders
``scale_batch_size`` leaves, ``lr_find`` with skipped training steps, the learning rate written to
the model and its hparams, and the same search results and training after a batch size search."""

from __future__ import annotations

import pytest

import compare

twins = compare.Twins("tuner.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> compare.Runs:
    return twins.run(tmp_path_factory.mktemp("twins"))


@pytest.mark.parametrize("case", twins.cases)
def test_same_as_lightning(runs: compare.Runs, case: str) -> None:
    compare.same(runs, case)
