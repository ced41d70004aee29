"""When the Trainer steps learning-rate schedulers is Lightning 2.6.6's rule
(tests/twins/scheduler_stepping.py under both; [Note: when schedulers step] in
fullshard.trainer.loops.fit_loop): frequencies of "step" schedulers count batches in the epoch,
an epoch cut short by ``max_steps`` steps no "epoch" scheduler, ``on_train_batch_start``
returning -1 makes its batch the epoch's last, a missing plateau metric raises or warns.
"""

from __future__ import annotations

import pytest

import compare

twins = compare.Twins("scheduler_stepping.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> compare.Runs:
    return twins.run(tmp_path_factory.mktemp("twins"))


@compare.needs_lightning
@pytest.mark.parametrize("case", twins.cases)
def test_same_as_lightning(runs: compare.Runs, case: str) -> None:
    compare.same(runs, case)
