"""Trainer arguments Lightning 2.6.6 refuses when the Trainer is built, compared with Lightning
(issue 37): fullshard refuses each at the same point, with an exception the same ``except``
clause catches, a message naming the same things, and nothing written. The cases are in
tests/twins/bad_arguments.py; fullshard's own refusals (inputs Lightning accepts) are in
tests/test_errors.py."""

from __future__ import annotations

import pytest

import compare

twins = compare.Twins("bad_arguments.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> compare.Runs:
    return twins.run(tmp_path_factory.mktemp("twins"))


@compare.needs_lightning
@pytest.mark.parametrize("case", twins.cases)
def test_same_as_lightning(runs: compare.Runs, case: str) -> None:
    compare.same(runs, case)
    # every input is refused (a case where both accepted would compare equal too)
    assert all(seen["caught"] is True and seen["written"] == [] for seen in runs.fullshard[case].values())
