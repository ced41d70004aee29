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
    assert json.loads((tmp_path / "profiles.json").read_text()) == paired["profiles"]
    assert report["ratios"]["tokens_per_s"] > 0 and report["ratios"]["peak_memory"] > 0
    llama = parts["llama-fsdp2"]["figures"]
    assert llama["checkpointed"] == 2 and llama["timed_steps"] == 3 and llama["peak_memory_mb"] > 0
    assert llama["planner_peak_mb"] > 0 and llama["planner_parts_mb"]["activations"] > 0
    # memory that is not tensors (on CPU: the resident set's growth) beside the planner's model of it
    assert llama["non_tensor"]["process_peak_mb"] > 0 and llama["non_tensor"]["rss_before_mb"] > 0
    assert llama["planner_process_mb"] == pytest.approx(
        llama["planner_peak_mb"] + llama["planner_overhead_mb"]
    )
    assert parts["llama-compiled"]["figures"]["tokens_per_s"] > 0
    peaks = parts["save-peaks"]["figures"]
    assert peaks["full_mb"] > 0 and peaks["sharded_mb"] > 0 and peaks["training_peak_mb"] > 0
    save = parts["llama-save"]["figures"]
    assert save["async_committed"] and save["checkpoint_mb"] > 0 and save["sync_blocked_s"] > 0
    # the report renders into the docs' section "GPU"
    markdown = (tmp_path / "gpu_check.md").read_text()
    assert markdown.startswith("## GPU\n") and "| cuda-tests | ok |" in markdown


def test_profile_gaps_are_the_gpus_idle_time_between_kernels() -> None:
    """benchmarks/_gpu_speed.py's reading of a profiled step (only a GPU run has kernels): the
    busy time is the union of the kernels' intervals, a gap names the host operation then running."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    sys.path.insert(0, str(REPO / "benchmarks"))
    import _gpu_speed

    def event(
        kind: DeviceType, start: float, end: float, name: str = "k", parent: object = None
    ) -> SimpleNamespace:
        return SimpleNamespace(
            device_type=kind, time_range=SimpleNamespace(start=start, end=end), name=name, cpu_parent=parent
        )

    cuda, cpu = DeviceType.CUDA, DeviceType.CPU
    events = [
        event(cuda, 0, 1000),
        event(cuda, 500, 1500),  # overlaps the first: counted once
        event(cuda, 4500, 5000),  # 3 ms after the last one ended
        event(cuda, 5200, 6000),
        event(cpu, 1400, 4600, "Optimizer.step#Adam.step"),
        event(cpu, 2000, 3000, "aten::mul", parent=object()),  # not top-level
    ]
    summary = _gpu_speed.gaps(events)
    assert summary["gpu_span_ms"] == 6.0 and summary["gpu_busy_ms"] == 2.8
    assert abs(summary["gpu_idle_ms"] - 3.2) < 1e-9
    assert summary["gaps"][0] == {"at_ms": 1.5, "ms": 3.0, "host": ["Optimizer.step#Adam.step"]}
    assert summary["gaps"][1] == {"at_ms": 5.0, "ms": 0.2, "host": []}


def test_paired_figures_pair_the_runs_of_each_round() -> None:
    """A round whose Lightning run failed drops out of the ratio; the others pair by round."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import _gpu_speed

    def run(round_: int, framework: str, step: float, variant: str = "baseline", ok: bool = True) -> dict:
        figures = {"step_s": step, "tokens_per_s": 1000 / step, "peak_memory_mb": 100.0, "profile": None}
        return {
            "round": round_,
            "framework": framework,
            "variant": variant,
            "status": "ok" if ok else "failed",
        } | (figures if ok else {})

    runs = [
        run(0, "fullshard", 0.5),
        run(0, "lightning", 0.4),
        run(0, "fullshard", 0.45, "mp-lightning"),
        run(1, "fullshard", 0.6),
        run(1, "lightning", 1.0, ok=False),
        run(2, "fullshard", 0.4),
        run(2, "lightning", 0.5),
    ]
    figures = _gpu_speed.paired_figures(runs)
    assert figures["tokens_per_s_ratio_range"] == [0.8, 1.25]  # rounds 0 and 2 only
    assert figures["fullshard_step_s"] == 0.5 and figures["lightning_steps_s"] == [0.4, 0.5]
    assert figures["variants"]["mp-lightning"]["vs_baseline"] == 0.9
