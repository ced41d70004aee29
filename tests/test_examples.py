"""The README's main job and the example scripts run end to end."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

import forkserver
from conftest import check_ok

ROOT = Path(__file__).parents[1]
pytestmark = pytest.mark.multiprocess


def _run(args: list[str], cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")}
    return subprocess.run(
        [forkserver.python(), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env
    )


def test_demo_loss_falls(tmp_path: Path) -> None:
    result = _run(["-m", "fullshard.demos", "--max-steps", "20", "--root-dir", str(tmp_path)], cwd=tmp_path)
    check_ok(result)
    match = re.search(
        r"done: 20 steps on 2 process\(es\); last train_loss ([\d.]+), val_loss ([\d.]+)", result.stdout
    )
    assert match, result.stdout
    assert float(match.group(1)) < 4.0 and float(match.group(2)) < 4.0  # ln(256) = 5.55 at the start


def test_regressor_example_trains_and_resumes(tmp_path: Path) -> None:
    script = str(ROOT / "examples" / "regressor.py")
    check_ok(_run([script, "--max-epochs", "2", "--root-dir", str(tmp_path)], cwd=tmp_path))
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()
    result = _run(
        [script, "--max-epochs", "3", "--root-dir", str(tmp_path), "--resume", "last"], cwd=tmp_path
    )
    check_ok(result)
    assert "best checkpoint:" in result.stdout and "step=42" in result.stdout


def test_readme_use_it_block_runs(tmp_path: Path) -> None:
    """The README's "Use it" code is a complete script a newcomer can paste and run."""
    section = (ROOT / "README.md").read_text().split("## Use it", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert code, "README's Use it section has no Python block"
    script = tmp_path / "use_it.py"
    script.write_text(code.group(1))
    check_ok(_run([str(script)], cwd=tmp_path))
    assert (tmp_path / "model.ckpt").is_file()
