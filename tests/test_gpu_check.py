"""benchmarks/gpu_check.py tried on CPU: every part of the GPU check runs with tiny sizes, so the
first GPU run starts from a script known to run (its figures go to docs/benchmarks.md, "GPU")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    parts = report["parts"]
    assert list(parts) == [
        "transformer-paired",
        "llama-fsdp2",
        "llama-compiled",
        "save-peaks",
        "llama-save",
        "cuda-tests",
    ]
    # without a GPU every CUDA test is collected and skipped, none fails
    tests = parts["cuda-tests"]
    assert tests["status"] == "ok" and tests["tests"], tests.get("output_tail")
    assert {t["outcome"] for t in tests["tests"]} == {"skipped"}
    for name, part in parts.items():
        assert part["status"] == "ok", (name, part.get("output_tail"))
    paired = parts["transformer-paired"]["figures"]
    runs = {(r["framework"], r["variant"]): r for r in paired["runs"]}
    assert all(r["status"] == "ok" for r in runs.values()), paired["runs"]
    # one round in --tiny: fullshard and Lightning, then every variant of fullshard once
    assert list(runs) == [("fullshard", "baseline"), ("lightning", "baseline")] + [
        ("fullshard", v) for v in ("mp-lightning", "mp-fp32-params", "nonfinite-off")
    ]
    ours, theirs = runs["fullshard", "baseline"], runs["lightning", "baseline"]
    assert ours["strategy"] == "FSDPStrategy" and ours["world_size"] == 2 and ours["tokens_per_s"] > 0
    assert theirs["strategy"] == "SingleDeviceStrategy" and theirs["timed_steps"] == 3
    assert set(paired["variants"]) == {"mp-lightning", "mp-fp32-params", "nonfinite-off"}
    # the last round's two runs each profiled one step: its top operations (no GPU: no gaps)
    assert set(paired["profiles"]) == {"fullshard", "lightning"}
    assert all(p["top"] and p["top"][0]["ms"] > 0 for p in paired["profiles"].values())
    assert report["ratios"]["tokens_per_s"] > 0 and report["ratios"]["peak_memory"] > 0
    llama = parts["llama-fsdp2"]["figures"]
    assert llama["checkpointed"] == 2 and llama["timed_steps"] == 3 and llama["peak_memory_mb"] > 0
    assert llama["planner_peak_mb"] > 0 and llama["planner_parts_mb"]["activations"] > 0
    assert parts["llama-compiled"]["figures"]["tokens_per_s"] > 0
    peaks = parts["save-peaks"]["figures"]
    assert peaks["full_mb"] > 0 and peaks["sharded_mb"] > 0 and peaks["training_peak_mb"] > 0
    save = parts["llama-save"]["figures"]
    assert save["async_committed"] and save["checkpoint_mb"] > 0 and save["sync_blocked_s"] > 0
    # the report renders into the docs' section "GPU"
    markdown = (tmp_path / "gpu_check.md").read_text()
    assert markdown.startswith("## GPU\n") and "| cuda-tests | ok |" in markdown
