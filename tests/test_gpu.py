"""Checks that need a CUDA device: NCCL, real CPU offload. Skipped on machines without one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import check_ok, run_script

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("args", [["--strategy", "ddp"], ["--strategy", "single_device", "--devices", "1"]])
def test_ddp_and_single_device_on_cuda(tmp_path: Path, args: list[str]) -> None:
    devices = ["--devices", str(min(torch.cuda.device_count(), 2))] if "--devices" not in args else []
    check_ok(run_script("train_mlp.py", "--out", str(tmp_path), "--accelerator", "cuda", *devices, *args))
    assert json.loads((tmp_path / "progress.json").read_text())["global_step"] == 8


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["--offload"],
        ["--precision", "bf16-mixed"],
        ["--fsdp2"],
        ["--fsdp2", "--offload"],
        ["--fsdp2", "--offload", "--clip", "0.5"],  # the norm of CPU shards reduced over NCCL
    ],
    ids=["plain", "offload", "bf16", "fsdp2", "fsdp2-offload", "fsdp2-offload-clip"],
)
def test_fsdp_on_cuda(tmp_path: Path, extra: list[str]) -> None:
    devices = str(min(torch.cuda.device_count(), 2))
    if devices == "1":
        pytest.skip("FSDP parity on CUDA needs 2 GPUs")
    check_ok(
        run_script(
            "train_fsdp.py", "--out", str(tmp_path), "--accelerator", "cuda", "--devices", devices, *extra
        )
    )
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["global_step"] == 6 and result["offload"] == ("--offload" in extra)
