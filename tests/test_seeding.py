"""Random-number streams as Lightning 2.6.6's (tests/twins/seeding.py under both): the
distributed strategies seed again from ``seed_everything``'s record when a process joins the job.

Under FSDP, FSDP2 and model parallel (which Lightning runs only on GPUs) the re-seeding is the
same code as under DDP (``ParallelStrategy.setup_environment``); the parity tests of those
strategies (tests/test_fsdp_parity.py, tests/test_model_parallel.py) run with it.
"""

from __future__ import annotations

import random

import pytest
import torch

import compare
import fullshard
from fullshard.seed import reset_seed

twins = compare.Twins("seeding.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> compare.Runs:
    return twins.run(tmp_path_factory.mktemp("twins"))


@compare.needs_lightning
@pytest.mark.parametrize("case", twins.cases)
def test_same_as_lightning(runs: compare.Runs, case: str) -> None:
    compare.same(runs, case)


def test_reset_seed_seeds_as_seed_everything_did() -> None:
    fullshard.seed_everything(8)
    first = (torch.rand(3), random.random())
    torch.rand(7)
    reset_seed()
    again = (torch.rand(3), random.random())
    assert torch.equal(first[0], again[0]) and first[1] == again[1]
