"""Lightning's examples' imports, ``Trainer(plugins=)`` and the demo classes, compared with
Lightning 2.6.6 (tests/twins/module_paths.py)."""

from __future__ import annotations

import pytest

import compare

twins = compare.Twins("module_paths.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> compare.Runs:
    return twins.run(tmp_path_factory.mktemp("twins"))


@compare.needs_lightning
@pytest.mark.parametrize("case", twins.cases)
def test_same_as_lightning(runs: compare.Runs, case: str) -> None:
    compare.same(runs, case)
