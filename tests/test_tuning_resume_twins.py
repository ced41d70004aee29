"""Fine-tuning callbacks, resuming, the tuner and the prediction writer compared with Lightning
2.6.6 (tests/twins/tuning_resume.py): a run resumed after BackboneFinetuning added a parameter
group or after StochasticWeightAveraging started, ``max_epochs`` below the checkpoint's epoch, a
checkpoint holding a callback's state that the run lacks, a BaseFinetuning subclass with batch
norm layers (frozen and trained), the tuner's results and what it leaves, and
``write_on_epoch_end``'s ``batch_indices``."""

from __future__ import annotations

import pytest

import compare

twins = compare.Twins("tuning_resume.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> compare.Runs:
    return twins.run(tmp_path_factory.mktemp("twins"))


@pytest.mark.parametrize("case", twins.cases)
def test_same_as_lightning(runs: compare.Runs, case: str) -> None:
    compare.same(runs, case)


def test_swa_resumed_runs_equal_the_uninterrupted_ones(runs: compare.Runs) -> None:
    for case in ("case_resume_after_swa_started", "case_resume_after_swa_replaced_a_scheduler"):
        assert runs.fullshard[case]["same_as_straight"], case
