"""FSDPStrategy (FSDP1) on CPU with gloo: what FSDP1 alone has (manual ``wrap()``, the guide's
manual-wrapping flow, HYBRID_SHARD through process groups). The options both FSDP strategies
share are checked against a single-process reference in tests/test_fsdp_parity.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import check_ok, run_script
from fsdp_reference import reference_run

pytestmark = pytest.mark.multiprocess

# FSDP reduces gradients with a reduce-scatter over flattened shards: the sums run in another order
# than one process's backward, so float32 results agree to ~1e-6 after a few Adam steps, not bitwise.
FP32_TOL = {"rtol": 1e-4, "atol": 1e-5}


@pytest.fixture(scope="module")
def reference() -> dict[str, torch.Tensor]:
    return reference_run()[0]


def _train(tmp_path: Path, *args: str) -> tuple[dict[str, torch.Tensor], dict]:
    check_ok(run_script("train_fsdp.py", "--out", str(tmp_path), *args, timeout=180))
    return _read(tmp_path)


def _read(out: Path) -> tuple[dict[str, torch.Tensor], dict]:
    return torch.load(out / "params.pt"), json.loads((out / "result.json").read_text())


def _assert_close(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], **tol: float) -> None:
    assert actual.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], msg=key, **(tol or FP32_TOL))


def test_manual_wrap_is_honoured(tmp_path: Path, reference: dict[str, torch.Tensor]) -> None:
    check_ok(
        result := run_script("train_fsdp.py", "--out", str(tmp_path), "--manual-wrap", "--wrap", "classes")
    )
    assert "auto_wrap_policy is ignored" in result.stderr
    params = torch.load(tmp_path / "params.pt")
    units = dict(json.loads((tmp_path / "result.json").read_text())["units"])
    assert list(units) == ["", "blocks.0", "blocks.1", "blocks.2", "blocks.3"]
    # manual wrap builds inside configure_model (after the seed, in the same order): same init
    _assert_close(params, reference)


def test_hybrid_shard_on_a_2x2_mesh(tmp_path: Path) -> None:
    reference, _, _ = reference_run(batch_size=32)
    params, _ = _train(tmp_path, "--devices", "4", "--sharding", "HYBRID_SHARD", "--mesh", "2,2")
    _assert_close(params, reference)


def test_optimizer_without_sharded_parameters(tmp_path: Path) -> None:
    result = run_script("train_fsdp.py", "--out", str(tmp_path), "--bad-optimizer", timeout=60)
    assert result.returncode != 0
    assert "references no parameter of the FSDP-wrapped model" in result.stderr


@pytest.fixture(scope="module")
def manual_wrap_single(tmp_path_factory: pytest.TempPathFactory) -> Path:
    single = tmp_path_factory.mktemp("guide_single")
    check_ok(
        run_script(
            "guide_manual_wrap.py", "--out", str(single), "--devices", "1", "--strategy", "single_device"
        )
    )
    return single


@pytest.mark.parametrize("state_dict_type", ["full", "sharded"])
def test_the_guides_manual_wrapping_flow(
    tmp_path: Path, manual_wrap_single: Path, state_dict_type: str
) -> None:
    """Lightning's guide, "Manual wrapping" (its class verbatim): a wrapped layer stays reachable
    under its old name too, which is one module under two names, not a tie; it trains like one
    process, and its checkpoints hold whole tensors under both names and resume."""
    sharded, single = tmp_path, manual_wrap_single
    args = ("--out", str(sharded), "--state-dict-type", state_dict_type)
    check_ok(run_script("guide_manual_wrap.py", *args, timeout=180))
    result = json.loads((sharded / "result.json").read_text())
    assert result["steps"] == [4, 6]
    assert result["units"] == ["", "block.0", "block.1", "model.0"]
    for name in ("model", "resumed"):
        expected = torch.load(single / f"{name}.pt")
        actual = torch.load(sharded / f"{name}.pt")
        assert sorted(actual) == sorted(expected)
        assert actual["linear_layer.weight"].shape == (32, 32)
        assert torch.equal(actual["linear_layer.weight"], actual["model.0.weight"])
        _assert_close(actual, expected)
