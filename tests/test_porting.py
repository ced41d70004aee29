"""The porting suite: Lightning-style scripts (tests/porting/*.py), switched to fullshard by their
import block alone, must behave as they did under Lightning 2.6.6.

Each script runs on 2 CPU processes under fullshard with ``ddp`` and with ``fsdp`` and is compared
with what it recorded under Lightning with ``ddp`` (``model_parallel_tp``: ``model_parallel`` under
both, a 1 x 2 tensor-parallel mesh; ``runner.RUN_WITH``) (tests/porting/expected/<script>.json, written
by tests/porting/regenerate.py): per rank, the hooks called on the module, the datamodule and a
recording callback, in order and with their arguments; the epoch and step each hook saw; the
metrics at fixed points; named values; and the script's own checks, which compare the results
with plain PyTorch in one process (final weights, validation/test losses, predictions).

[Note: porting normalisations]
Only what legitimately differs is normalised; each item is applied in ``_normalise``:

1. Hooks fullshard documents as not supported (``NOT_CALLED_BY_FULLSHARD`` in
   tests/porting/hooks.py, the "not supported" hook rows of docs/lightning.md) are dropped from
   Lightning's record: fullshard warns when a module defines them and never calls them, and the
   recorder does not define them under fullshard.
2. Metric values are compared within 1e-4 (relative and absolute): DDP's bucketed all-reduce and
   FSDP's reduce-scatter add float32 numbers in different orders. Named float values likewise.
3. Resuming with ``fit(ckpt_path=...)``, fullshard calls ``configure_optimizers`` before the
   checkpoint's hooks (``on_load_checkpoint``, the DataModule's and callbacks'
   ``load_state_dict``) instead of after them: it checks the checkpoint's optimizer states
   against the optimizers before loading anything, so they must exist first (docs/lightning.md,
   "Differs on purpose"); ``on_fit_start`` then comes after those hooks, as in Lightning. In
   Lightning's record the call is moved to just before those hooks.

4. Lightning's ``WeightAveraging``/``EMAWeightAveraging`` call the module's ``configure_model`` in
   their ``setup`` hook, before the module's own ``setup``, to copy the whole model; fullshard keeps
   the average as each process's share of the weights and builds the model once, where the
   strategy builds it (docs/callbacks.md). A ``configure_model`` call before the module's
   ``setup`` (right after the callbacks' ``setup``) is dropped from Lightning's record.

Nothing else is normalised: the same hooks, in the same order, with the same batch indices and
samples (``x0``: the first number of a batch, i.e. the same sampler order), at the same epoch and
global step; the same metric names at the same points.
"""

from __future__ import annotations

import difflib
import math
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent / "porting"))
from hooks import NOT_CALLED_BY_FULLSHARD
from runner import SCRIPTS, load_expected, run_port, run_with

import forkserver

pytestmark = pytest.mark.multiprocess

CASES = [
    pytest.param(script, strategy, id=f"{script}-{strategy}")
    for script in SCRIPTS
    for strategy in run_with(script)
]
TOLERANCE = 1e-4
_RUNS: dict[tuple[str, str], tuple[Any, dict[str, Any]]] = {}


@pytest.fixture(scope="module")
def run_case(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Run a (script, strategy) once under fullshard; later tests of the same case reuse it."""

    def get(script: str, strategy: str) -> tuple[Any, dict[str, Any]]:
        key = (script, strategy)
        if key not in _RUNS:
            out = tmp_path_factory.mktemp(f"{script}-{strategy}")
            _RUNS[key] = run_port(script, "fullshard", strategy, out, python=forkserver.python(), timeout=240)
        return _RUNS[key]

    return get


_RESTORE_HOOKS = ("on_load_checkpoint", "load_state_dict")


def _normalise(rank_record: dict[str, Any]) -> list[tuple[str, str]]:
    """(event, state) pairs of Lightning's record without the hooks fullshard does not call (1.),
    with configure_optimizers ahead of a resume's restore hooks (3.), without a weight averaging
    callback's early configure_model (4.)."""
    pairs: list[tuple[str, str]] = []
    for event, state in zip(rank_record["events"], rank_record["states"], strict=True):
        who, _, rest = event.partition(" ")
        hook = rest.split("(")[0]
        if who == "M" and hook in NOT_CALLED_BY_FULLSHARD:
            continue
        if who == "M" and hook == "configure_model" and pairs and pairs[-1][0].startswith("C setup("):
            continue  # 4.: called from a callback's setup, before the module's
        if who == "M" and hook == "configure_optimizers":
            at = len(pairs)
            while at and pairs[at - 1][0].partition(" ")[2].split("(")[0] in _RESTORE_HOOKS:
                at -= 1
            pairs.insert(at, (event, state))
            continue
        pairs.append((event, state))
    return pairs


def _diff(expected: list[str], actual: list[str], limit: int = 150) -> str:
    lines = list(difflib.unified_diff(expected, actual, "lightning", "fullshard", n=4, lineterm=""))
    more = f"\n... {len(lines) - limit} more diff lines" if len(lines) > limit else ""
    return "\n".join(lines[:limit]) + more


def _ranks(script: str, strategy: str, run_case: Any) -> list[tuple[int, dict[str, Any], dict[str, Any]]]:
    result, record = run_case(script, strategy)
    expected = load_expected(script)
    missing = [r for r, data in enumerate(record["ranks"]) if data is None]
    if missing:
        pytest.fail(
            f"ranks {missing} wrote no record (exit {result.returncode})\n{result.stdout[-4000:]}\n{result.stderr[-6000:]}"
        )
    return [(r, expected["ranks"][r], record["ranks"][r]) for r in range(len(expected["ranks"]))]


@pytest.mark.parametrize(("script", "strategy"), CASES)
def test_runs_and_passes_its_own_checks(script: str, strategy: str, run_case: Any) -> None:
    result, record = run_case(script, strategy)
    problems = []
    for rank, data in enumerate(record["ranks"]):
        if data is None:
            problems.append(f"rank {rank}: no record")
            continue
        if data["error"]:
            problems.append(f"rank {rank} raised:\n{data['error']}")
        problems += [
            f"rank {rank}: check failed: {name}: {detail}" for name, ok, detail in data["checks"] if not ok
        ]
    expected = load_expected(script)
    for rank, (want, got) in enumerate(zip(expected["ranks"], record["ranks"], strict=True)):
        if got is not None and [c[0] for c in want["checks"]] != [c[0] for c in got["checks"]]:
            problems.append(
                f"rank {rank}: checks made {[c[0] for c in got['checks']]}, Lightning made {[c[0] for c in want['checks']]}"
            )
    if result.returncode != 0:
        problems.append(f"exit {result.returncode}\n{result.stderr[-6000:]}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(("script", "strategy"), CASES)
def test_hooks_are_called_in_lightnings_order(script: str, strategy: str, run_case: Any) -> None:
    for rank, want, got in _ranks(script, strategy, run_case):
        expected = [event for event, _ in _normalise(want)]
        assert got["events"] == expected, f"rank {rank}: hook calls differ\n{_diff(expected, got['events'])}"


@pytest.mark.parametrize(("script", "strategy"), CASES)
def test_hooks_see_lightnings_epoch_and_step(script: str, strategy: str, run_case: Any) -> None:
    for rank, want, got in _ranks(script, strategy, run_case):
        expected = [f"{state:8} {event}" for event, state in _normalise(want)]
        actual = [f"{state:8} {event}" for event, state in zip(got["events"], got["states"], strict=True)]
        assert actual == expected, f"rank {rank}: (epoch, step) at hooks differ\n{_diff(expected, actual)}"


def _compare(want: Any, got: Any, where: str, problems: list[str]) -> None:
    if isinstance(want, dict) and isinstance(got, dict):
        if sorted(want) != sorted(got):
            problems.append(f"{where}: names {sorted(got)}, Lightning {sorted(want)}")
        for key in sorted(set(want) & set(got)):
            _compare(want[key], got[key], f"{where}[{key!r}]", problems)
    elif isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        for i, (a, b) in enumerate(zip(want, got, strict=True)):
            _compare(a, b, f"{where}[{i}]", problems)
    elif isinstance(want, float) and isinstance(got, int | float) and not isinstance(got, bool):
        if not math.isclose(want, got, rel_tol=TOLERANCE, abs_tol=TOLERANCE):
            problems.append(f"{where}: {got}, Lightning {want}")
    elif want != got:
        problems.append(f"{where}: {got!r}, Lightning {want!r}")


@pytest.mark.parametrize(("script", "strategy"), CASES)
def test_metrics_match_lightning(script: str, strategy: str, run_case: Any) -> None:
    problems: list[str] = []
    for rank, want, got in _ranks(script, strategy, run_case):
        want_points = [m["point"] for m in want["metrics"]]
        got_points = [m["point"] for m in got["metrics"]]
        if want_points != got_points:
            problems.append(f"rank {rank}: snapshot points differ\n{_diff(want_points, got_points)}")
            continue
        for w, g in zip(want["metrics"], got["metrics"], strict=True):
            _compare(
                {k: v for k, v in w.items() if k != "point"},
                {k: v for k, v in g.items() if k != "point"},
                f"rank {rank} at {w['point']}",
                problems,
            )
    assert not problems, "\n".join(problems[:60])


@pytest.mark.parametrize(("script", "strategy"), CASES)
def test_values_match_lightning(script: str, strategy: str, run_case: Any) -> None:
    problems: list[str] = []
    for rank, want, got in _ranks(script, strategy, run_case):
        _compare(want["values"], got["values"], f"rank {rank} values", problems)
    assert not problems, "\n".join(problems[:60])
