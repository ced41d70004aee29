"""Run a twin script (tests/twins/) under Lightning 2.6.6 and under fullshard and compare.

Lightning lives in its own environment (``/tmp/lvenv``, made by ``.ci/run``; never a dependency
of fullshard); without it the comparison tests are skipped with that reason. A test module does::

    twins = compare.Twins("progress_loggers.py")

    @pytest.fixture(scope="module")
    def runs(tmp_path_factory):
        return twins.run(tmp_path_factory.mktemp("twins"))   # both frameworks, in parallel

    @pytest.mark.parametrize("case", twins.cases)
    def test_same_as_lightning(runs, case):
        compare.same(runs, case)
"""

from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import lightning_env

TWINS = Path(__file__).parent / "twins"
LIGHTNING_PYTHON = lightning_env.PYTHON
needs_lightning = pytest.mark.lightning  # tests/conftest.py: lightning_env.require() before the test
_LAUNCH_ENV = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")


@dataclass
class Runs:
    lightning: dict[str, Any]
    fullshard: dict[str, Any]
    logs: dict[str, str]


class Twins:
    """One twin script: its case names (read from its source) and runs of it."""

    def __init__(self, script: str) -> None:
        self.path = TWINS / script
        tree = ast.parse(self.path.read_text())
        self.cases = [
            n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("case_")
        ]

    def run(self, out_dir: Path, timeout: float = 240) -> Runs:
        lightning_env.require()
        src = str(Path(__file__).parents[1] / "src")
        procs = {}
        for framework, python in (("lightning", str(LIGHTNING_PYTHON)), ("fullshard", sys.executable)):
            env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_ENV}
            env.update(TWIN_FRAMEWORK=framework, PYTHONUNBUFFERED="1", PYTHONHASHSEED="0")
            path = [str(TWINS)] + ([src] if framework == "fullshard" else [])
            env["PYTHONPATH"] = os.pathsep.join(path)
            procs[framework] = subprocess.Popen(
                [python, str(self.path), "--out", str(out_dir / f"{framework}.json")],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
                cwd=out_dir,
            )
        logs = {}
        for framework, proc in procs.items():
            try:
                logs[framework] = proc.communicate(timeout=timeout)[0]
            except subprocess.TimeoutExpired:
                for p in procs.values():
                    p.kill()
                raise
            assert proc.returncode == 0, (
                f"{framework} run of {self.path.name} failed:\n{logs[framework][-6000:]}"
            )
        return Runs(
            lightning=json.loads((out_dir / "lightning.json").read_text()),
            fullshard=json.loads((out_dir / "fullshard.json").read_text()),
            logs=logs,
        )


def close(a: Any, b: Any, rel: float = 1e-4, abs_: float = 1e-6) -> bool:
    """Equal JSON data, floats within ``rel``/``abs_``."""
    if isinstance(a, float) or isinstance(b, float):
        return (
            isinstance(a, (int, float))
            and isinstance(b, (int, float))
            and math.isclose(a, b, rel_tol=rel, abs_tol=abs_)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k], rel, abs_) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y, rel, abs_) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def same(runs: Runs, case: str, rel: float = 1e-4) -> None:
    """Fail unless the case observed the same under both (floats within ``rel``)."""
    lit, ours = runs.lightning.get(case), runs.fullshard.get(case)
    assert lit is not None, f"{case} did not run under Lightning:\n{runs.logs['lightning'][-4000:]}"
    assert ours is not None, f"{case} did not run under fullshard:\n{runs.logs['fullshard'][-4000:]}"
    assert not (isinstance(lit, dict) and "case failed" in lit), (
        f"{case} failed under Lightning: {lit}\n{runs.logs['lightning'][-4000:]}"
    )
    assert close(ours, lit, rel), (
        f"{case} differs from Lightning 2.6.6\n  fullshard: {json.dumps(ours, sort_keys=True)}\n"
        f"  lightning: {json.dumps(lit, sort_keys=True)}\n{runs.logs['fullshard'][-3000:]}"
    )
