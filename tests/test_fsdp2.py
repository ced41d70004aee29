"""FSDP2Strategy (``fully_shard``) on CPU with gloo: what FSDP2 alone has (``reshard_after_forward``
as a number, frozen parameters sharing a unit, its mesh), its configuration errors. The options
both FSDP strategies share are checked in tests/test_fsdp_parity.py.

Run: pytest tests/test_fsdp2.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from conftest import check_ok, run_script
from fsdp_reference import initial_params, reference_run
from fullshard.errors import MisconfigurationError
from fullshard.strategies import STRATEGY_REGISTRY, FSDP2Strategy

# FSDP2 reduce-scatters gradients per parameter: sums in another order than one process's
# backward, so float32 results agree to ~1e-6 after a few Adam steps, not bitwise (as FSDP1).
FP32_TOL = {"rtol": 1e-4, "atol": 1e-5}

RUNS = {  # what FSDP2 alone takes; the options both strategies share: tests/test_fsdp_parity.py
    "reshard_int": ["--sharding", "1"],
    "frozen": ["--freeze"],  # frozen and trainable parameters in one unit (blocks.0)
}


@pytest.fixture(scope="module")
def reference() -> dict[str, torch.Tensor]:
    return reference_run()[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fsdp2_runs")
    fsdp2 = {name: args if "--registry-name" in args else [*args, "--fsdp2"] for name, args in RUNS.items()}
    specs = [f"--run={name}:{' '.join(args)}" for name, args in fsdp2.items()]
    check_ok(run_script("train_fsdp.py", "--out", str(out), *specs, timeout=280))
    return out


def _read(out: Path) -> tuple[dict[str, torch.Tensor], dict]:
    return torch.load(out / "params.pt"), json.loads((out / "result.json").read_text())


def _assert_close(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], msg=key, **FP32_TOL)


@pytest.mark.multiprocess
def test_reshard_after_forward_as_an_int(runs: Path, reference: dict[str, torch.Tensor]) -> None:
    """``sharding_strategy=1``: fully_shard's ``reshard_after_forward`` as a number of ranks."""
    params, result = _read(runs / "reshard_int")
    assert result["strategy"] == "FSDP2Strategy"
    _assert_close(params, reference)
    assert result["global_step"] == 6
    assert sorted(dict(result["units"])) == sorted(result["actual_units"])


@pytest.mark.multiprocess
def test_frozen_parameters_stay_and_share_a_unit_with_trainable_ones(runs: Path) -> None:
    params, result = _read(runs / "frozen")
    init = initial_params()
    assert "blocks.0" in dict(result["units"])
    for key in ("blocks.0.fc.weight", "blocks.0.fc.bias"):
        assert torch.equal(params[key], init[key]), key
    for key in ("blocks.0.norm.weight", "blocks.1.fc.weight", "head.weight"):
        assert not torch.equal(params[key], init[key]), key


@pytest.mark.multiprocess
def test_hybrid_shard_on_a_2x2_mesh(tmp_path: Path) -> None:
    reference, _, _ = reference_run(batch_size=32)
    args = ["--devices", "4", "--sharding", "HYBRID_SHARD", "--mesh", "2,2", "--fsdp2"]
    check_ok(run_script("train_fsdp.py", "--out", str(tmp_path), *args, timeout=240))
    _assert_close(_read(tmp_path)[0], reference)


# ------------------------------------------------------------------------ configuration errors
def test_registered_names() -> None:
    assert STRATEGY_REGISTRY.get("fsdp2").__class__ is FSDP2Strategy  # type: ignore[attr-defined]
    offload = STRATEGY_REGISTRY.get("fsdp2_cpu_offload")
    assert isinstance(offload, FSDP2Strategy) and offload.offloads_params


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"sharding_strategy": "HYBRID_SHARD_ZERO2"},
            MisconfigurationError,
            "'HYBRID_SHARD_ZERO2' is not a sharding strategy of FSDP2. Use one of 'FULL_SHARD'",
        ),
        ({"sharding_strategy": 0}, MisconfigurationError, "must be a positive int"),
        (
            {"mixed_precision": "bf16"},
            TypeError,
            "must be a torch.distributed.fsdp.MixedPrecisionPolicy, got str",
        ),
        ({"cpu_offload": "yes"}, TypeError, "cannot be used with FSDP2: pass True, False"),
        ({"use_orig_params": False}, MisconfigurationError, "use_orig_params is an FSDP1 option"),
        ({"mesh": None}, MisconfigurationError, "mesh is set by FSDP2Strategy itself"),
        (
            {"async_save": True},
            MisconfigurationError,
            "async_save=True writes sharded checkpoints in the background, but state_dict_type='full'",
        ),
        ({"auto_wrap_policy": 3}, TypeError, "auto_wrap_policy"),
    ],
)
def test_bad_options_are_refused(kwargs: dict, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        FSDP2Strategy(**kwargs)


def test_fsdp1_mixed_precision_is_refused_with_the_fsdp2_type() -> None:
    from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy

    with pytest.raises(TypeError, match=r"FSDP1's torch\.distributed\.fsdp\.MixedPrecision; FSDP2 takes"):
        FSDP2Strategy(mixed_precision=MixedPrecision(param_dtype=torch.bfloat16))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    assert FSDP2Strategy(mixed_precision=policy).mixed_precision is policy


def test_one_cpu_process_is_refused(tmp_path: Path) -> None:
    import fullshard

    with pytest.raises(
        MisconfigurationError, match=r"strategy='fsdp2' with a single CPU process shards nothing"
    ):
        fullshard.Trainer(accelerator="cpu", devices=1, strategy="fsdp2", default_root_dir=tmp_path)


def test_mesh_that_does_not_cover_the_processes_is_refused(tmp_path: Path) -> None:
    import fullshard

    strategy = FSDP2Strategy(sharding_strategy="HYBRID_SHARD", device_mesh=(2, 2))
    with pytest.raises(
        MisconfigurationError, match=r"device_mesh=\(2, 2\) covers 4 processes, but the job has 2"
    ):
        fullshard.Trainer(accelerator="cpu", devices=2, strategy=strategy, default_root_dir=tmp_path)


def test_plan_is_printed_as_for_fsdp1() -> None:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

    model = nn.Sequential(Block(), Block(), nn.Linear(8, 2))
    plan = FSDP2Strategy(auto_wrap_policy={Block}).plan_wrapping(model, world_size=4)
    assert [u.name for u in plan.units] == ["", "0", "1"]
    assert plan.shard_size == 4
    assert "FULL_SHARD" in plan.summary()
