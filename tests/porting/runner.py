"""Run a porting script under one framework and strategy, and merge its per-rank records.

Used by ``regenerate.py`` (Lightning, to write the fixtures) and by ``tests/test_porting.py``
(fullshard). Needs only the standard library, so any Python can drive it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
EXPECTED = HERE / "expected"
WORLD_SIZE = 2
SCRIPTS = (
    "plateau_param_groups",
    "clip_accumulate",
    "early_stop_test_predict",
    "datamodule_resume",
    "fast_dev_run",
    "logging_gather",
    "custom_batch",
    "cli_yaml",
    "gan_manual",
    "warmup_optimizer_step",
    "metrics_writer_multi_val",
    "model_parallel_tp",
    "finetune_ema_schedule",
    "tuner_lr_find",
    "lora_adapter",
    "logger_backends",
)
# The strategy a script is recorded with under Lightning (regenerate.py) and the strategies it
# runs with under fullshard (tests/test_porting.py); the rest: Lightning "ddp", fullshard ddp
# and fsdp (Lightning refuses FSDP on CPU).
RECORDED_WITH = {"model_parallel_tp": "model_parallel"}
RUN_WITH = {"model_parallel_tp": ("model_parallel",)}


def recorded_with(script: str) -> str:
    return RECORDED_WITH.get(script, "ddp")


def run_with(script: str) -> tuple[str, ...]:
    return RUN_WITH.get(script, ("ddp", "fsdp"))


# Variables a launcher sets for the processes it starts; a run must not inherit them.
_LAUNCH_ENV = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")


def run_port(
    script: str,
    framework: str,
    strategy: str,
    out: Path,
    *,
    python: str = sys.executable,
    timeout: float = 180,
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """Run ``script`` (a name from SCRIPTS) and return the process and the merged record."""
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_ENV and not k.startswith("PL_")}
    env.update(PORT_FRAMEWORK=framework, PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
    out.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [python, str(HERE / f"{script}.py"), "--strategy", strategy, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=out,
        env=env,
    )
    ranks = []
    # a child may still be writing after the launching process left (not long after a failure)
    deadline = time.monotonic() + (20 if result.returncode == 0 else 3)
    for rank in range(WORLD_SIZE):
        path = out / f"rank{rank}.json"
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        ranks.append(json.loads(path.read_text()) if path.exists() else None)
    record = {
        "script": script,
        "framework": framework,
        "strategy": strategy,
        "returncode": result.returncode,
        "ranks": ranks,
    }
    return result, record


def load_expected(script: str) -> dict[str, Any]:
    return json.loads((EXPECTED / f"{script}.json").read_text())  # type: ignore[no-any-return]
