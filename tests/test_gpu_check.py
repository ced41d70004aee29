"""benchmarks/gpu_check.py tried on CPU: every part of the GPU check runs with tiny sizes, so the
first GPU run starts from a script known to run (its figures go to docs/benchmarks.md, "GPU")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import lightning_env

REPO = Path(__file__).resolve().parents[1]


def test_gpu_check_runs_every_part_on_cpu(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "benchmarks/gpu_check.py",
            "--accelerator",
            "cpu",
            "--tiny",
            "--out",
            str(tmp_path),
            "--lightning-python",
            str(lightning_env.require()),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    parts = report["parts"]
    assert list(parts) == [
        "transformer-fullshard",
        "transformer-lightning",
        "llama-fsdp2",
        "llama-save",
        "cuda-tests",
    ]
    # without a GPU every CUDA test is collected and skipped, none fails
    tests = parts["cuda-tests"]
    assert tests["status"] == "ok" and tests["tests"], tests.get("output_tail")
    assert {t["outcome"] for t in tests["tests"]} == {"skipped"}
    for name, part in parts.items():
        assert part["status"] == "ok", (name, part.get("output_tail"))
    ours = parts["transformer-fullshard"]["figures"]
    assert ours["strategy"] == "FSDPStrategy" and ours["world_size"] == 2 and ours["tokens_per_s"] > 0
    assert ours["estimate_mb"] > 0 and ours["units"] == 5  # the root and 2 + 2 Transformer layers
    llama = parts["llama-fsdp2"]["figures"]
    assert llama["checkpointed"] == 2 and llama["timed_steps"] == 3 and llama["peak_memory_mb"] > 0
    assert llama["planner_peak_mb"] > 0 and llama["planner_parts_mb"]["activations"] > 0
    # memory that is not tensors (on CPU: the resident set's growth) beside the planner's model of it
    assert llama["non_tensor"]["process_peak_mb"] > 0 and llama["non_tensor"]["rss_before_mb"] > 0
    assert llama["planner_process_mb"] == pytest.approx(
        llama["planner_peak_mb"] + llama["planner_overhead_mb"]
    )
    save = parts["llama-save"]["figures"]
    assert save["async_committed"] and save["checkpoint_mb"] > 0 and save["sync_blocked_s"] > 0
    theirs = parts["transformer-lightning"]["figures"]
    assert theirs["framework"] == "lightning" and theirs["strategy"] == "SingleDeviceStrategy"
    assert report["ratios"]["tokens_per_s"] > 0
    # the report renders into the docs' section "GPU"
    markdown = (tmp_path / "gpu_check.md").read_text()
    assert markdown.startswith("## GPU\n") and "| cuda-tests | ok |" in markdown
