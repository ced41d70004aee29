"""FSDPStrategy (FSDP1) and FSDP2Strategy (``fully_shard``) on CPU with gloo: each option trained by
2 processes agrees with a single-process reference. One test body for both strategies; what only
one of them has is tested in tests/test_fsdp.py and tests/test_fsdp2.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import check_ok, run_script
from fsdp_reference import initial_params, reference_run

pytestmark = pytest.mark.multiprocess

# FSDP reduces gradients with a reduce-scatter (FSDP1 over flattened shards, FSDP2 per parameter):
# the sums run in another order than one process's backward, so float32 results agree to ~1e-6
# after a few Adam steps, not bitwise.
FP32_TOL = {"rtol": 1e-4, "atol": 1e-5}
BLOCKS = ["", "blocks.0", "blocks.1", "blocks.2", "blocks.3"]

# One job per strategy trains every configuration below one after another (a launch costs
# seconds; a run of this model milliseconds), and each test checks its own run's results.
RUNS = {
    "full": ["--sharding", "FULL_SHARD"],
    "grad_op": ["--sharding", "shard_grad_op"],
    "no_shard": ["--sharding", "NO_SHARD"],
    "full+ac": ["--sharding", "FULL_SHARD", "--ac", "classes"],
    "cpu_offload": ["--registry-name", "{strategy}_cpu_offload"],
    "names": ["--wrap", "names", "--ac", "names"],
    "callable": ["--wrap", "callable", "--ac", "callable"],
    "torch_policy": ["--wrap", "torch", "--ac", "torch"],
    "no_policy": ["--wrap", "none"],
    "bf16": ["--precision", "bf16-mixed"],
    "meta_init": ["--empty-init", "--max-steps", "0"],
    "meta_train": ["--empty-init"],
    "clip": ["--clip", "0.5"],
    "accumulate": ["--accumulate", "2", "--batch-size", "4"],
}
STRATEGY_CLASS = {"fsdp": "FSDPStrategy", "fsdp2": "FSDP2Strategy"}


def run_args(strategy: str, name: str) -> list[str]:
    """``RUNS[name]`` for ``strategy`` (train_fsdp.py builds FSDP2Strategy with ``--fsdp2``)."""
    args = [arg.format(strategy=strategy) for arg in RUNS[name]]
    return args if "--registry-name" in args or strategy == "fsdp" else [*args, "--fsdp2"]


@pytest.fixture(scope="module")
def reference() -> dict[str, torch.Tensor]:
    return reference_run()[0]


@pytest.fixture(scope="module", params=["fsdp", "fsdp2"])
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    strategy = request.param
    out = tmp_path_factory.mktemp(f"{strategy}_runs")
    specs = [f"--run={name}:{' '.join(run_args(strategy, name))}" for name in RUNS]
    check_ok(run_script("train_fsdp.py", "--out", str(out), *specs, timeout=280))
    return strategy, out


def _read(out: Path) -> tuple[dict[str, torch.Tensor], dict]:
    return torch.load(out / "params.pt"), json.loads((out / "result.json").read_text())


def _assert_close(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], msg=key, **FP32_TOL)


@pytest.mark.parametrize(
    "name",
    [
        "full",
        "grad_op",
        "no_shard",
        "full+ac",
        "cpu_offload",
        "names",
        "callable",
        "torch_policy",
        "no_policy",
    ],
)
def test_parity_with_single_process(
    runs: tuple[str, Path], reference: dict[str, torch.Tensor], name: str
) -> None:
    strategy, out = runs
    args = RUNS[name]
    params, result = _read(out / name)
    assert result["strategy"] == STRATEGY_CLASS[strategy]
    _assert_close(params, reference)
    assert result["global_step"] == 6
    assert 0 < result["val_loss"] < result["losses"][0]  # validate() after fit() reuses the sharded model
    units = dict(result["units"])
    # the plan predicted the units torch made (FSDP1 wraps them in the plan's order)
    assert (list(units) if strategy == "fsdp" else sorted(units)) == (
        result["actual_units"] if strategy == "fsdp" else sorted(result["actual_units"])
    )
    assert sum(units.values()) == sum(v.numel() for v in reference.values())
    wrap = args[args.index("--wrap") + 1] if "--wrap" in args else "classes"
    if wrap == "none" or "--registry-name" in args:
        assert list(units) == [""]
    elif wrap == "callable":  # size_based_auto_wrap_policy(min_num_params=100): each fc (272), then the rest
        assert sorted(units) == ["", "blocks", "blocks.0.fc", "blocks.1.fc", "blocks.2.fc", "blocks.3.fc"]
        assert units["blocks"] == 4 * 32 and units["blocks.0.fc"] == 272
    else:
        assert sorted(units) == BLOCKS
        assert units["blocks.0"] == 16 * 16 + 16 + 2 * 16
    if "--ac" in args and wrap != "callable":
        assert result["checkpointed"] == BLOCKS[1:]
    if "--registry-name" in args:
        assert result["offload"] is True  # on CPU the parameters are in host memory anyway


def test_bf16_mixed_stays_close(runs: tuple[str, Path], reference: dict[str, torch.Tensor]) -> None:
    params, result = _read(runs[1] / "bf16")
    assert all(torch.isfinite(torch.tensor(result["losses"])))
    # bfloat16 keeps 8 mantissa bits, and Adam's normalised steps turn small gradient differences
    # into visible parameter differences, so elementwise tolerances say little. What must hold: the
    # training moved the parameters the same way. Tolerance: the updates (trained - initial) of
    # the bf16 run and the float32 run point the same way (cosine > 0.95) and have norms within 10%.
    init = initial_params()
    delta_bf16 = torch.cat([(params[k] - init[k]).flatten() for k in init])
    delta_fp32 = torch.cat([(reference[k] - init[k]).flatten() for k in init])
    cosine = torch.nn.functional.cosine_similarity(delta_bf16, delta_fp32, dim=0)
    assert cosine > 0.95, f"cosine {cosine:.4f}"
    assert delta_bf16.norm() == pytest.approx(float(delta_fp32.norm()), rel=0.10)


def test_meta_device_init_equals_eager_init(runs: tuple[str, Path]) -> None:
    params, _ = _read(runs[1] / "meta_init")
    for key, value in initial_params().items():
        assert torch.equal(params[key], value), key


def test_meta_device_init_trains_like_eager(
    runs: tuple[str, Path], reference: dict[str, torch.Tensor]
) -> None:
    _assert_close(_read(runs[1] / "meta_train")[0], reference)


def test_gradient_clipping_uses_the_global_norm(runs: tuple[str, Path]) -> None:
    reference, _, reference_norms = reference_run(clip=0.5)
    params, result = _read(runs[1] / "clip")
    assert len(result["norms"]) == 6
    assert result["norms"] == pytest.approx(reference_norms, rel=1e-4)
    assert max(reference_norms) > 0.5  # clipping was active
    _assert_close(params, reference)


def test_gradient_accumulation(runs: tuple[str, Path], reference: dict[str, torch.Tensor]) -> None:
    params, result = _read(runs[1] / "accumulate")
    assert result["global_step"] == 6 and len(result["losses"]) == 12
    _assert_close(params, reference)
