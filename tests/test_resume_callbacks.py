"""Resuming after a callback changed the optimizer (BackboneFinetuning's added parameter group,
StochasticWeightAveraging's SWALR scheduler) and the checks made when resuming, compared with
Lightning 2.6.6 (tests/twins/resume_callbacks.py)."""

from __future__ import annotations

import pytest

import compare

twins = compare.Twins("resume_callbacks.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> compare.Runs:
    return twins.run(tmp_path_factory.mktemp("twins"))


@pytest.mark.parametrize("case", twins.cases)
def test_same_as_lightning(runs: compare.Runs, case: str) -> None:
    compare.same(runs, case)


def test_swa_resumed_run_equals_the_uninterrupted_one(runs: compare.Runs) -> None:
    for case in ("case_resume_after_swa_started", "case_resume_after_swa_replaced_a_scheduler"):
        assert runs.fullshard[case]["same_as_straight"], case
