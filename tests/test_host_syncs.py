"""No more host-device synchronisations in a training step than Lightning 2.6.6 makes
(tests/twins/host_syncs.py counts them under both: [Note: counting synchronisations on the CPU]
there says what is counted and what is not). A default step of fullshard reads nothing on the
host but the metrics of a logging step; the non-finite check reads its copy without waiting
([Note: reading the loss without waiting] in fullshard/trainer/nonfinite.py)."""

from __future__ import annotations

import json

import pytest

import compare

twins = compare.Twins("host_syncs.py")
COUNTS = [case for case in twins.cases if case != "case_the_counter_counts"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> compare.Runs:
    return twins.run(tmp_path_factory.mktemp("twins"))


@compare.needs_lightning
def test_the_counter_counts_each_read_and_not_a_staged_copy(runs: compare.Runs) -> None:
    compare.same(runs, "case_the_counter_counts")
    assert runs.fullshard["case_the_counter_counts"] == {
        "aten._local_scalar_dense.default": 2,
        "aten.nonzero.default": 1,
        "cpu": 1,
        "numpy": 1,
        "tolist": 2,
    }


@compare.needs_lightning
@pytest.mark.parametrize("case", COUNTS)
def test_no_more_syncs_per_step_than_lightning(runs: compare.Runs, case: str) -> None:
    ours, theirs = runs.fullshard.get(case), runs.lightning.get(case)
    assert isinstance(ours, dict) and "per_step" in ours, (ours, runs.logs["fullshard"][-3000:])
    assert isinstance(theirs, dict) and "per_step" in theirs, (theirs, runs.logs["lightning"][-3000:])
    assert ours["per_step"] <= theirs["per_step"] + 1e-9, (
        f"{case}: fullshard makes {ours['per_step']} host reads a step, Lightning {theirs['per_step']}\n"
        f"fullshard: {json.dumps(ours['places'], indent=1)}\nLightning: {json.dumps(theirs['places'], indent=1)}"
    )


@compare.needs_lightning
def test_a_default_step_reads_only_at_logging_steps(runs: compare.Runs) -> None:
    """Beyond Lightning's count: a default step reads nothing but the logged metrics, every
    log_every_n_steps (50) steps, one read each (so 0.02 a step)."""
    places = runs.fullshard["case_default"]["places"]
    per_step = {place: count for place, count in places.items() if count >= 0.05}
    assert not per_step, per_step
