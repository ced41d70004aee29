"""Generated Lightning scripts observe under fullshard what they observed under Lightning 2.6.6.

The corpus (tests/differential/: generate.py draws a script per seed, run.py runs it and records
the hooks called, metrics, logger calls, returned values, warnings, exceptions, files and
checkpoints) was run once under Lightning into tests/fixtures/ (``python
tests/differential/record.py`` records it again); here only fullshard's side runs. Each script
must observe the same, apart from the differences docs/lightning.md accepts, with its reason
("Differential harness: accepted differences"). ``python tests/differential/fuzz.py`` runs fresh
scripts under both and reports, minimized, what differs.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent / "differential"))

import corpus
import differences
import generate

RECORDED = corpus.load_fixture()
SEEDS = list(range(corpus.CORPUS_SIZE))


@pytest.fixture(scope="module")
def ours() -> dict[str, Any]:
    return corpus.run("fullshard", sys.executable, seeds=SEEDS, jobs=2)


def test_the_fixture_is_what_the_generator_draws() -> None:
    assert RECORDED["lightning"] == "2.6.6"
    assert sorted(RECORDED["scripts"], key=int) == [str(s) for s in SEEDS]
    stale = [s for s in SEEDS if RECORDED["scripts"][str(s)]["spec"] != generate.spec(s)]
    assert not stale, f"generate.py draws other scripts than recorded for seeds {stale[:10]}: run record.py"


def test_most_scripts_run_to_the_end() -> None:
    """The corpus exercises training, not mostly refusals: at least 3 in 4 scripts finish."""
    failed = [s for s, r in RECORDED["scripts"].items() if r["observed"]["error"]]
    assert len(failed) <= corpus.CORPUS_SIZE // 4, f"{len(failed)} scripts raise under Lightning"


@pytest.mark.parametrize("seed", SEEDS)
def test_same_as_lightning(ours: dict[str, Any], seed: int) -> None:
    theirs = RECORDED["scripts"][str(seed)]["observed"]
    found = differences.differences(theirs, corpus.trim(ours[str(seed)]))
    left = differences.unexplained(found, differences.accepted())
    assert not left, (
        f"script {seed} differs from Lightning 2.6.6 (see it: python -c 'import sys; "
        f'sys.path.insert(0, "tests/differential"); import generate; print(generate.render(generate.spec({seed})))\'):\n'
        + "\n".join(left)
    )


def test_every_accepted_difference_is_still_found(ours: dict[str, Any]) -> None:
    """An accepted difference that no script shows any more is a stale row: delete it."""
    found = [
        line
        for seed in SEEDS
        for line in differences.differences(
            RECORDED["scripts"][str(seed)]["observed"], corpus.trim(ours[str(seed)])
        )
    ]
    stale = [
        pattern for pattern, _ in differences.accepted() if not any(re.search(pattern, f) for f in found)
    ]
    assert not stale, f"accepted differences in docs/lightning.md that no corpus script shows: {stale}"
