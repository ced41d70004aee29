"""Checks that need a CUDA device: NCCL, CPU offload to host memory, autocast on the GPU, inductor's
GPU kernels, checkpoints saved from device memory, pinned staging buffers. Skipped without one.

The FSDP jobs run one process per GPU, at most two: with one GPU, FSDPStrategy and FSDP2Strategy
run on NCCL with world size 1 (torch's FSDP1 then falls back to NO_SHARD; FSDP2 still shards,
over one rank). What only two GPUs can show is skipped with one, and says so.

Every command takes its device from :func:`device_args`, and every assertion but those that
name a device holds on CPU too (gloo, two processes), so that the commands can be tried without
a GPU: set ``ACCELERATOR = "cpu"`` and ``torch.cuda.is_available`` to a function returning True
before this module is imported (a ``-p`` plugin), and run this file.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from ckpt_helpers import assert_same_state
from conftest import check_ok, run_script

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

ACCELERATOR = "cuda"  # "cpu" for a dry run of the commands below (see the module's docstring)
# FSDP with one process computes what one process without FSDP computes, up to the order of a
# few sums (the reduction of gradients over flattened shards): ~1e-6 after six Adam steps
FP32_TOL = {"rtol": 1e-4, "atol": 1e-5}
# inductor fuses LayerNorm and the residual into kernels of its own, with their own summation order
COMPILE_TOL = {"rtol": 1e-3, "atol": 1e-4}
BLOCKS = ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]
STEPS = 6  # train_fsdp.py's and gpu_job.py train's default --max-steps
# train_fsdp.py's BlockModel: 4 blocks of fc and norm, and a head
MODEL_KEYS = [
    *(f"{b}.{layer}.{p}" for b in BLOCKS for layer in ("fc", "norm") for p in ("weight", "bias")),
    "head.weight",
    "head.bias",
]


def processes() -> int:
    """Processes of a multi-process job: one per GPU, at most 2 (on CPU 2: FSDP refuses one)."""
    return 2 if ACCELERATOR == "cpu" else min(torch.cuda.device_count(), 2)


def device_args() -> list[str]:
    return ["--accelerator", ACCELERATOR, "--devices", str(processes())]


def gpu_job(out: Path, job: str, *args: str, timeout: float = 120) -> dict[str, Any]:
    """Run ``tests/scripts/gpu_job.py JOB`` on this module's device; its result.json."""
    check_ok(run_script("gpu_job.py", job, "--out", str(out), *device_args(), *args, timeout=timeout))
    return json.loads((out / "result.json").read_text())


def load(path: Path) -> Any:
    return torch.load(path, map_location="cpu")


def assert_close(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], **tol: float) -> None:
    assert actual.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], msg=key, **(tol or FP32_TOL))


def assert_moved_like_float32(params: dict[str, torch.Tensor], reference_dir: Path) -> None:
    """bfloat16 keeps 8 mantissa bits and Adam's normalised steps turn small gradient differences
    into visible parameter differences; what must hold is that training moved the parameters the
    same way as the float32 reference did (as in test_fsdp.py's test_bf16_mixed_stays_close):
    updates (trained - initial) pointing the same way, with norms within 10%."""
    init, fp32 = load(reference_dir / "init.pt"), load(reference_dir / "params.pt")
    delta = torch.cat([(params[k].float() - init[k].float()).flatten() for k in init])
    delta_fp32 = torch.cat([(fp32[k] - init[k].float()).flatten() for k in init])
    cosine = torch.nn.functional.cosine_similarity(delta, delta_fp32, dim=0)
    assert cosine > 0.95, f"cosine {cosine:.4f}"
    assert delta.norm() == pytest.approx(float(delta_fp32.norm()), rel=0.10)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[dict[str, Any], Path]]:
    """train_fsdp.py's model trained by one process without FSDP on this module's device, with
    the FSDP jobs' global batch (8 per process); ``extra``: more gpu_job.py train options. One
    job per set of options, on first use. Returns the result and the run's folder (init.pt,
    params.pt)."""

    @functools.cache
    def run(*extra: str) -> tuple[dict[str, Any], Path]:
        out = tmp_path_factory.mktemp("reference")
        batch = str(8 * processes())
        return gpu_job(out, "train", "--strategy", "single", "--batch-size", batch, *extra), out

    return run


# ------------------------------------------------------------------------------------ DDP, one GPU
@pytest.mark.parametrize(
    "args",
    [["--strategy", "ddp"], ["--strategy", "single_device", "--devices", "1"]],
    ids=["ddp", "single_device"],
)
def test_ddp_and_single_device_on_cuda(tmp_path: Path, args: list[str]) -> None:
    devices = ["--devices", str(processes())] if "--devices" not in args else []
    check_ok(
        run_script("train_mlp.py", "--out", str(tmp_path), "--accelerator", ACCELERATOR, *devices, *args)
    )
    assert json.loads((tmp_path / "progress.json").read_text())["global_step"] == 8


# ----------------------------------------------------------------------- FSDP1 and FSDP2 training
FSDP_RUNS = {
    "plain": [],
    "fsdp2": ["--fsdp2"],
    "bf16": ["--precision", "bf16-mixed"],
    "fsdp2-bf16": ["--fsdp2", "--precision", "bf16-mixed"],
    "offload-clip": ["--offload", "--clip", "0.5"],  # FSDP1's clip_grad_norm_ over host gradients
    # the norm of the CPU shards, reduced over NCCL
    "fsdp2-offload-clip": ["--fsdp2", "--offload", "--clip", "0.5"],
}


@pytest.mark.parametrize("name", list(FSDP_RUNS))
def test_fsdp_on_cuda(
    tmp_path: Path, name: str, reference: Callable[..., tuple[dict[str, Any], Path]]
) -> None:
    """tests/scripts/train_fsdp.py on the device: the run trains, and agrees with one process
    without FSDP (float32: closely; bfloat16: the updates point the same way)."""
    extra = FSDP_RUNS[name]
    check_ok(run_script("train_fsdp.py", "--out", str(tmp_path), *device_args(), *extra))
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["global_step"] == STEPS and result["offload"] == ("--offload" in extra)
    assert result["strategy"] == ("FSDP2Strategy" if "--fsdp2" in extra else "FSDPStrategy")
    assert [u[0] for u in result["units"]] == result["actual_units"] == ["", *BLOCKS]
    assert all(torch.isfinite(torch.tensor(result["losses"])))
    assert 0 < result["val_loss"] < result["losses"][0]  # validate() after fit() on the sharded model
    params = load(tmp_path / "params.pt")
    clip = ["--clip", extra[extra.index("--clip") + 1]] if "--clip" in extra else []
    expected, reference_dir = reference(*clip)
    if "--precision" not in extra:
        assert_close(params, load(reference_dir / "params.pt"))
        if clip:  # the norm before clipping is the whole model's, not one shard's
            assert result["norms"] == pytest.approx(expected["norms"], rel=1e-4)
            assert max(expected["norms"]) > 0.5  # clipping was active
        return
    assert_moved_like_float32(params, reference_dir)


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
def test_bf16_true_on_cuda(
    tmp_path: Path, strategy: str, reference: Callable[..., tuple[dict[str, Any], Path]]
) -> None:
    """precision="bf16-true": parameters, gradients and optimizer state in bfloat16 on the GPU
    (gpu_job.py: train_fsdp.py's loss compares a float32 output with bfloat16 targets, which CUDA
    refuses in backward)."""
    result = gpu_job(tmp_path, "train", "--strategy", strategy, "--precision", "bf16-true")
    assert result["param_dtypes"] == ["torch.bfloat16"] and result["param_devices"] == [ACCELERATOR]
    assert result["global_step"] == STEPS and all(torch.isfinite(torch.tensor(result["losses"])))
    for step in result["grads"]:
        assert step["grad_numel"] == step["param_numel"] > 0 and step["finite"] and step["nonzero"]
    assert_moved_like_float32(load(tmp_path / "params.pt"), reference()[1])


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
def test_cpu_offload_keeps_parameters_on_the_host(
    tmp_path: Path, strategy: str, reference: Callable[..., tuple[dict[str, Any], Path]]
) -> None:
    """cpu_offload=True on CUDA: the sharded parameters and their gradients live in host memory,
    the layers compute on the GPU, and the steps equal one process's without FSDP."""
    result = gpu_job(tmp_path, "train", "--strategy", strategy, "--offload")
    assert result["at_start"]["param_devices"] == ["cpu"]  # sharded into host memory at setup
    assert result["param_devices"] == ["cpu"]  # and still there after training
    assert result["compute_devices"] == [ACCELERATOR]  # gathered onto the device for forward/backward
    assert len(result["grads"]) == result["global_step"] == STEPS
    for step in result["grads"]:  # every parameter's gradient reduced, offloaded, finite
        assert step["grad_numel"] == step["param_numel"] > 0
        assert step["devices"] == ["cpu"] and step["finite"] and step["nonzero"]
    if strategy == "fsdp":  # torch's FSDP1 does not shard over one process
        assert result["torch_sharding"] == ("NO_SHARD" if processes() == 1 else "FULL_SHARD")
    assert_close(load(tmp_path / "params.pt"), load(reference()[1] / "params.pt"))


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
def test_activation_checkpointing_on_cuda(
    tmp_path: Path, strategy: str, reference: Callable[..., tuple[dict[str, Any], Path]]
) -> None:
    """activation_checkpointing_policy={Block}: each Block is wrapped for recomputation, inside its
    own FSDP unit, and recomputing on the GPU changes no result."""
    result = gpu_job(tmp_path, "train", "--strategy", strategy, "--ac")
    assert result["checkpointed"] == BLOCKS  # the wrap plan
    assert result["wrappers"] == [[name, "Block"] for name in BLOCKS]  # the CheckpointWrappers torch holds
    assert result["actual_units"] == ["", *BLOCKS]
    assert result["param_devices"] == result["compute_devices"] == [ACCELERATOR]
    assert result["global_step"] == STEPS
    assert_close(load(tmp_path / "params.pt"), load(reference()[1] / "params.pt"))


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
def test_empty_init_materialises_on_cuda(tmp_path: Path, strategy: str) -> None:
    """empty_init=True: the layers are built on the meta device and initialised unit by unit
    directly on the GPU. The device's random numbers are not the CPU's, so the values are checked
    against each layer's own init rather than against an eager build (tests/test_fsdp.py does
    that on CPU)."""
    result = gpu_job(tmp_path, "train", "--strategy", strategy, "--empty-init")
    start = result["at_start"]
    assert not start["meta"] and start["param_devices"] == [ACCELERATOR]
    assert result["compute_devices"] == [ACCELERATOR]
    init = load(tmp_path / "init.pt")
    assert sorted(init) == sorted(MODEL_KEYS)
    for name, value in init.items():
        assert torch.isfinite(value).all(), name
        if ".norm." in name:  # LayerNorm.reset_parameters: ones and zeros
            assert torch.equal(
                value, torch.ones_like(value) if name.endswith("weight") else torch.zeros_like(value)
            )
        else:  # nn.Linear(16, ...).reset_parameters: uniform in +-1/sqrt(16), drawn (not a constant)
            assert value.abs().max() <= 0.25 and (value.numel() == 1 or value.std() > 0.01), name
    assert result["global_step"] == STEPS
    assert all(torch.isfinite(torch.tensor(result["losses"])))
    assert min(result["losses"][STEPS // 2 :]) < result["losses"][0]


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
def test_compile_under_fsdp_on_cuda(
    tmp_path: Path, strategy: str, reference: Callable[..., tuple[dict[str, Any], Path]]
) -> None:
    """Trainer(compile=...) with inductor, which builds GPU (triton) kernels: each FSDP unit compiled
    in place, compiled once (no recompiles), trains as the eager model does."""
    result = gpu_job(tmp_path, "train", "--strategy", strategy, "--compile", "inductor", timeout=240)
    graphs = result["graphs"]  # dynamo's compiled graphs after each step
    assert graphs[0] > 0 and graphs == [graphs[0]] * STEPS, graphs
    assert_close(load(tmp_path / "params.pt"), load(reference()[1] / "params.pt"), **COMPILE_TOL)


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
def test_grad_scaler_with_16_mixed_on_cuda(tmp_path: Path, strategy: str) -> None:
    """precision="16-mixed": a ShardedGradScaler scales the loss, skips the steps whose float16
    gradients overflowed (halving its scale) and takes the others; its state goes into the
    checkpoint's "grad_scaler" entry and comes back in a fresh Trainer."""
    steps = 10
    options = ["--strategy", strategy, "--precision", "16-mixed", "--max-steps", str(steps), "--save"]
    result = gpu_job(tmp_path, "train", *options)
    assert result["scaler"]["class"] == "ShardedGradScaler"
    scales = result["scales"]  # after each step; it starts at 2**16
    assert len(scales) == result["global_step"] == steps
    taken = [after >= before for before, after in zip([2.0**16, *scales], scales, strict=False)]
    assert any(taken), scales  # some steps were not skipped ...
    params, init = load(tmp_path / "params.pt"), load(tmp_path / "init.pt")
    assert any(not torch.equal(params[k], init[k]) for k in init)  # ... and they changed the weights
    assert all(torch.isfinite(torch.tensor(result["losses"])))
    assert result["saved_grad_scaler"]["scale"] == result["scaler"]["scale"] == scales[-1]
    assert result["resumed_step"] == steps and result["resumed_scale"] == scales[-1]


# ------------------------------------------------------------------------------------ checkpoints
@pytest.mark.parametrize(
    ("strategy", "fmt"),
    [("fsdp", "full"), ("fsdp", "sharded"), ("fsdp2", "full"), ("fsdp2", "sharded")],
    ids=["fsdp-full", "fsdp-sharded", "fsdp2-full", "fsdp2-sharded"],
)
def test_checkpoint_from_gpu_resumes_bitwise(tmp_path: Path, strategy: str, fmt: str) -> None:
    """tests/scripts/ckpt_job.py's model (dropout: the device's random numbers are resumed too,
    and a shuffled loader) trains 8 steps, saving from device memory at step 4; a fresh Trainer
    resumed from that save ends bitwise where the uninterrupted run ended
    (Trainer(deterministic=True))."""
    result = gpu_job(
        tmp_path, "resume", "--strategy", strategy, "--format", fmt, "--steps", "8", "--save-at", "4"
    )
    assert result["format"] == fmt and result["complete"] and result["verified"]
    assert result["saved_step"] == 4 and result["straight_step"] == result["resumed_step"] == 8
    assert result["resumed_losses"] == result["straight_losses"][4:]
    states = load(tmp_path / "states.pt")
    assert_same_state(states["resumed"], states["straight"])


@pytest.fixture(scope="module")
def async_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """gpu_job.py async: FSDP2Strategy(async_save=True) saves at step 4 of 8 in the background; a
    fresh Trainer loads that save."""
    out = tmp_path_factory.mktemp("async")
    return gpu_job(out, "async", "--steps", "8", "--save-at", "4"), out


def test_async_save_loads_back_equal(async_run: tuple[dict[str, Any], Path]) -> None:
    """save_checkpoint returns while the save goes on, training goes on meanwhile, and the
    checkpoint holds the state at the save: it loads back bitwise equal to it. On CUDA the save
    stages into pinned host buffers, kept for the next save."""
    result, out = async_run
    assert result["saved"]["pending"] and result["saved"]["staged_bytes"] > 0
    assert result["param_devices"] == [ACCELERATOR]
    assert result["complete"] and result["verified"] and result["saved_step"] == 4
    assert result["global_step"] == 8 and result["loaded_step"] == 4
    states = load(out / "states.pt")
    assert_same_state(states["loaded"], states["reference"])
    if ACCELERATOR == "cuda":
        assert result["kept_pinned"] == [True] and result["kept_bytes"] > 0
    else:  # host state is copied into memory of its own, freed once written
        assert result["kept_bytes"] == 0


def test_async_save_writes_from_pinned_host_memory(async_run: tuple[dict[str, Any], Path]) -> None:
    """What the writer thread writes is the host copy, on CUDA in pinned host memory (all but the
    optimizers' step counts, which training keeps on the CPU): [Note: staging off the training
    thread] in fullshard/checkpoint/staging.py."""
    written = async_run[0]["written"]
    assert written["tensors"] > 0 and written["devices"] == ["cpu"]
    assert written["pinned"] == [ACCELERATOR == "cuda"]


# ------------------------------------------------------------------------------- two GPUs or more
@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
def test_sharded_over_two_gpus(
    tmp_path: Path, strategy: str, reference: Callable[..., tuple[dict[str, Any], Path]]
) -> None:
    """Each of two processes holds half of every unit, and NCCL's all-gathers and reduce-scatters
    between two GPUs give one process's result."""
    if processes() < 2:
        pytest.skip("needs 2 CUDA devices: sharding over processes, and NCCL between GPUs (one is visible)")
    result = gpu_job(tmp_path, "train", "--strategy", strategy)
    if strategy == "fsdp":
        assert result["torch_sharding"] == "FULL_SHARD"
    # rank 0's shards: half of each unit, and FSDP2's split of the 1x16 head along its dim 0 (all of it)
    assert result["local_numel"] < 0.55 * result["full_numel"]
    assert_close(load(tmp_path / "params.pt"), load(reference()[1] / "params.pt"))
