"""BatchNorm under precision="bf16-mixed" with FSDP2 and FSDP1 on 2 CPU processes (issue 40): the
runs train, each BatchNorm's weight is float32 in its forward (as without FSDP), and the result is
the single-process run's ([Note: BatchNorm under FSDP2 mixed precision] in
fullshard.strategies.wrapping). The job: tests/scripts/batchnorm_job.py.

Run: pytest tests/test_batchnorm_mixed_precision.py
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from conftest import check_ok, run_script
from fullshard.strategies.wrapping import batch_norms_kept_in_float32

RUNS = ("fsdp2", "fsdp", "fsdp-root")  # fsdp-root: FSDP1 without an auto-wrap policy


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("batchnorm")
    check_ok(run_script("batchnorm_job.py", "--out", str(out), "--devices", "1", "--run", "single"))
    runs = [arg for run in RUNS for arg in ("--run", run)]
    check_ok(run_script("batchnorm_job.py", "--out", str(out), "--devices", "2", *runs, timeout=240))
    return {run: torch.load(out / f"{run}.pt") for run in ("single", *RUNS)}


@pytest.mark.multiprocess
@pytest.mark.parametrize("run", RUNS)
def test_batchnorm_trains_under_bf16_mixed_as_on_one_process(results: dict[str, Any], run: str) -> None:
    single, sharded = results["single"], results[run]
    assert single["seen"]["blocks.0.bn"] == ["torch.float32", "torch.bfloat16"]  # weight, input
    assert sharded["seen"] == single["seen"]
    assert sharded["state"].keys() == single["state"].keys()
    assert not torch.equal(single["state"]["bn.weight"], torch.ones(8))  # it trained
    assert single["state"]["bn.running_mean"].abs().sum() > 0
    for key, expected in single["state"].items():
        torch.testing.assert_close(sharded["state"][key], expected, rtol=1e-4, atol=1e-5, msg=key)


def test_which_batchnorms_are_kept_in_float32() -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    model = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.BatchNorm1d(4, affine=False), nn.SyncBatchNorm(4)
    )
    half = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    assert batch_norms_kept_in_float32(model, half) == [model[1], model[3]]  # the ones with parameters
    assert batch_norms_kept_in_float32(model, MixedPrecisionPolicy()) == []
    assert batch_norms_kept_in_float32(model, MixedPrecisionPolicy(param_dtype=torch.float32)) == []
    assert batch_norms_kept_in_float32(model, None) == []
    assert batch_norms_kept_in_float32(nn.BatchNorm2d(4), half) == []  # the root is the root unit
