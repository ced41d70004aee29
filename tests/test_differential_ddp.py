"""A subset of the differential corpus on 2 CPU processes observes under fullshard's "ddp" and
"fsdp" what it observed under Lightning 2.6.6's "ddp".

The subset (``corpus.ddp_subset``: the first corpus scripts that finish under Lightning and use
nothing a second process makes into another script) is rendered with ``strategy=..., devices=2``;
each script runs in its own process, which the framework's launcher starts again as rank 1
(``run.py --one``). Lightning's side was recorded once (``python tests/differential/record.py
--ddp``); here fullshard's runs, and each rank's observations are compared, apart from the
differences docs/lightning.md accepts ("Differential harness: accepted differences", and those
under "Differential harness on 2 processes").
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "differential"))

import corpus
import differences
import generate

pytestmark = pytest.mark.multiprocess

RECORDED = corpus.load_fixture(corpus.DDP_FIXTURE)
SEEDS = sorted(int(s) for s in RECORDED["scripts"])
# every script of the subset under each strategy, in one launched job per strategy
RUNS = [(strategy, s) for strategy in ("ddp", "fsdp") for s in SEEDS]
TWO_PROCESSES = differences.accepted(heading=differences.ACCEPTED_DDP_HEADING)


@pytest.fixture(scope="module")
def found() -> dict[tuple[str, int], list[str]]:
    """Each run's differences from Lightning's recording that the one-process table does not
    accept, every rank's, as ``rank R: <line>`` (what the 2-process table's rows match)."""
    one_process = differences.accepted()
    out: dict[tuple[str, int], list[str]] = {}
    for strategy in ("ddp", "fsdp"):
        launched = corpus.run_launched("fullshard", sys.executable, SEEDS, strategy=strategy)
        for seed in SEEDS:
            out[strategy, seed] = [
                f"rank {rank}: {line}"
                for rank, theirs in RECORDED["scripts"][str(seed)]["observed"].items()
                for line in differences.unexplained(
                    differences.differences(theirs, corpus.trim(launched[str(seed)][rank])), one_process
                )
            ]
    return out


def test_the_fixture_is_the_subset_the_generator_draws() -> None:
    assert (RECORDED["lightning"], RECORDED["strategy"], RECORDED["devices"]) == ("2.6.6", "ddp", 2)
    assert corpus.ddp_subset(corpus.load_fixture()) == SEEDS
    stale = [s for s in SEEDS if RECORDED["scripts"][str(s)]["spec"] != generate.spec(s)]
    assert not stale, f"generate.py draws other scripts than recorded for {stale}: run record.py --ddp"


@pytest.mark.parametrize(("strategy", "seed"), RUNS)
def test_same_as_lightning_ddp(found: dict[tuple[str, int], list[str]], strategy: str, seed: int) -> None:
    left = differences.unexplained(found[strategy, seed], TWO_PROCESSES)
    assert not left, (
        f"script {seed} with strategy={strategy!r}, devices=2 differs from Lightning 2.6.6's ddp (see it:"
        f" generate.render(generate.spec({seed}), strategy={strategy!r}, devices=2)):\n" + "\n".join(left)
    )


def test_every_accepted_2_process_difference_is_still_found(found: dict[tuple[str, int], list[str]]) -> None:
    """A row of the 2-process table that no run shows any more is stale: delete it."""
    lines = [line for run in found.values() for line in run]
    assert TWO_PROCESSES, "docs/lightning.md has no 2-process table"
    stale = [pattern for pattern, _ in TWO_PROCESSES if not any(re.search(pattern, line) for line in lines)]
    assert not stale, f"accepted 2-process differences that no run shows: {stale}"
