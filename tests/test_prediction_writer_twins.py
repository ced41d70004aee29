"""``BasePredictionWriter.write_on_epoch_end``'s ``predictions`` and ``batch_indices`` compared
with Lightning 2.6.6 (tests/twins/prediction_writer.py)."""

from __future__ import annotations

import pytest

import compare

twins = compare.Twins("prediction_writer.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> compare.Runs:
    return twins.run(tmp_path_factory.mktemp("twins"))


@pytest.mark.parametrize("case", twins.cases)
def test_same_as_lightning(runs: compare.Runs, case: str) -> None:
    compare.same(runs, case)
