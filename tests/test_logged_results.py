"""What ``validate``/``test`` return, the rows ``CSVLogger`` writes, and ``callback_metrics``/
``logged_metrics`` after a failed call, compared with Lightning 2.6.6 (issue 38: the
differential harness's findings). The cases are in tests/twins/logged_results.py."""

from __future__ import annotations

import pytest

import compare

twins = compare.Twins("logged_results.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> compare.Runs:
    return twins.run(tmp_path_factory.mktemp("twins"))


@compare.needs_lightning
@pytest.mark.parametrize("case", twins.cases)
def test_same_as_lightning(runs: compare.Runs, case: str) -> None:
    compare.same(runs, case)
