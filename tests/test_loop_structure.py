"""The structure of fit's loops is Lightning 2.6.6's where the differential harness (issue 38)
found it differed: teardown after a failure, nothing to train, the validation schedule's
refusals, min_steps and early stops, accumulation on an iterable's last batch, resuming after an
epoch ended with -1, a reloaded loader's draws. The cases are in tests/twins/loop_structure.py."""

from __future__ import annotations

import pytest

import compare

twins = compare.Twins("loop_structure.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> compare.Runs:
    return twins.run(tmp_path_factory.mktemp("twins"))


@compare.needs_lightning
@pytest.mark.parametrize("case", twins.cases)
def test_same_as_lightning(runs: compare.Runs, case: str) -> None:
    compare.same(runs, case)
