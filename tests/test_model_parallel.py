"""ModelParallelStrategy (tensor parallel + FSDP2 on a 2-D mesh) on CPU with gloo: loss equal to
one process on a 2x2 mesh and tensor-parallel only, data split over the data-parallel ranks only,
and checkpoints that move between 2x2, 4x1 (fsdp2), 1x4, fsdp (FSDP1), one process and full files.

Run: pytest tests/test_model_parallel.py
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import fullshard
from ckpt_helpers import assert_same_state
from conftest import SCRIPTS, check_ok, run_script
from fullshard.checkpoint import tools
from fullshard.errors import MisconfigurationError
from fullshard.strategies import STRATEGY_REGISTRY, FSDP2Strategy, ModelParallelStrategy
from fullshard.strategies.tensor_parallel import parallelize

sys.path.insert(0, str(SCRIPTS))
import model_parallel_job as job

# Tensor parallelism splits the matmuls and reductions between ranks, and FSDP2 sums gradients
# in another order than one process's backward: float32 agrees to ~1e-6, not bitwise.
FP32_TOL = {"rtol": 1e-5, "atol": 1e-6}
STEPS, CLIP = 6, 0.5  # clip low enough to clip every step (norms ~0.6)
MORE = 2  # steps a run at another layout trains on from a 2x2 checkpoint


@contextlib.contextmanager
def _shared_dir(factory: pytest.TempPathFactory, name: str) -> Iterator[Path]:
    """``name``'s directory, the same for every xdist worker of this session; yields it under a
    lock, so that a job whose results several workers read runs once (the first to come runs it,
    writing ``done``; the others wait and find it)."""
    base = factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the workers' directories share this parent
    root = base / f"model_parallel_{name}"
    root.mkdir(parents=True, exist_ok=True)
    with open(base / f"model_parallel_{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield root
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _jobs(root: Path, devices: int, runs: list[dict[str, Any]], timeout: float = 240) -> None:
    """The ``runs`` (tests/scripts/model_parallel_job.py specs) in one job of ``devices``
    processes, unless a worker of this session ran them already."""
    if (root / "done").exists():
        return
    (root / "runs.json").write_text(json.dumps(runs))
    done = run_script(
        "model_parallel_job.py", "--devices", str(devices), "--runs", str(root / "runs.json"), timeout=timeout
    )
    check_ok(done)
    (root / "output.txt").write_text(done.stdout + done.stderr)


def _record(out: Path, rank: int) -> dict[str, Any]:
    return json.loads((out / f"rank{rank}.json").read_text())


def _final(out: Path) -> dict[str, Any]:
    return torch.load(out / "final.pt", weights_only=False)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same model, data and steps in this process, one device, global batches whole: the
    first STEPS steps, and (``more_*``) MORE steps after them."""
    out = tmp_path_factory.mktemp("reference")
    job.run({"out": str(out), "strategy": "single", "max_steps": STEPS + MORE, "clip": CLIP}, 1)
    record = _record(out, 0)
    first = {key: record[key][:STEPS] for key in ("losses", "grad_norms", "max_grads", "batches", "logged")}
    return {**first, "more_losses": record["losses"][STEPS:], "more_batches": record["batches"][STEPS:]}


@pytest.fixture(scope="module")
def hf_reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The Hugging Face-style model (tests/hf_llama.py) in this process, one device."""
    out = tmp_path_factory.mktemp("hf_reference")
    job.run({"out": str(out), "strategy": "single", "model": "hf", "max_steps": STEPS, "clip": CLIP}, 1)
    return _record(out, 0)


@pytest.fixture(scope="module")
def two_d(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One job of 4 processes: a 2x2 run (async sharded checkpoints at steps 3 and 6), its resume
    from step 3, and its step-6 checkpoint loaded at 2x2 (saved again as a full file), under fsdp2
    (4x1), at 1x4 and under fsdp (FSDP1); FSDP2Strategy with a plan; and three models built on the
    meta device beside their eager twins."""
    with _shared_dir(tmp_path_factory, "two_d") as root:
        _two_d_runs(root)
    return root


def _two_d_runs(root: Path) -> None:
    mid, last = root / "A/ckpts/epoch=0-step=3.ckpt", root / "A/ckpts/epoch=1-step=6.ckpt"
    mp = {"strategy": "model_parallel", "max_steps": STEPS, "clip": CLIP}
    runs = [
        {**mp, "out": str(root / "A"), "dp": 2, "tp": 2, "save_every": 3, "async": True, "record_init": True},
        {**mp, "out": str(root / "resumed"), "dp": 2, "tp": 2, "resume": str(mid)},
        {**mp, "out": str(root / "full"), "dp": 2, "tp": 2, "format": "full", "resume": str(last), "save": str(root / "full.ckpt")},
        {"strategy": "fsdp2", "out": str(root / "fsdp2"), "max_steps": STEPS + MORE, "resume": str(last), "clip": CLIP},
        {**mp, "out": str(root / "tp4"), "dp": 1, "tp": 4, "resume": str(last)},
        {"strategy": "fsdp", "out": str(root / "fsdp"), "max_steps": STEPS, "resume": str(last)},
        # FSDP2Strategy(tensor_parallel_size=2, tp_plan=...) with activation checkpointing: the same steps
        {**mp, "strategy": "fsdp2_tp", "out": str(root / "fsdp2_tp"), "tp": 2, "checkpointing": True, "record_init": True},
        # a Hugging Face-style model with its own plan: FSDP2Strategy(tensor_parallel_size=2, tp_plan="auto")
        {**mp, "strategy": "fsdp2_tp", "model": "hf", "out": str(root / "hf_auto"), "tp": 2, "record_init": True},
        # the same three built on the meta device (configure_model under torch.device("meta"), or
        # empty_init=True), split and sharded, then initialised
        {**mp, "out": str(root / "A_meta"), "dp": 2, "tp": 2, "lazy": True, "meta_device": True, "record_init": True},
        {**mp, "strategy": "fsdp2_tp", "out": str(root / "fsdp2_tp_meta"), "tp": 2, "checkpointing": True, "lazy": True, "empty_init": True, "record_init": True},
        {**mp, "strategy": "fsdp2_tp", "model": "hf", "out": str(root / "hf_auto_meta"), "tp": 2, "lazy": True, "empty_init": True, "record_init": True},
        # last: its failure ends the job's other processes (rank 0 writes the error)
        {**mp, "out": str(root / "root"), "dp": 2, "tp": 2, "mistake": "root"},
    ]  # fmt: skip
    _jobs(root, 4, runs)


@pytest.fixture(scope="module")
def tp_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One job of 2 processes: 1x2 (tensor parallel only) runs, plain, in bf16-mixed, compiled and
    with activation checkpointing; 2x1 in bf16-true; then a model left unsharded."""
    with _shared_dir(tmp_path_factory, "tp_only") as root:
        _tp_only_runs(root)
    return root


def _tp_only_runs(root: Path) -> None:
    tp2 = {"strategy": "model_parallel", "dp": 1, "tp": 2, "max_steps": STEPS, "clip": CLIP}
    runs = [
        {"strategy": "model_parallel", "out": str(root / "tp2"), "dp": 1, "tp": 2, "max_steps": STEPS, "clip": CLIP},
        {**tp2, "out": str(root / "bf16"), "precision": "bf16-mixed"},
        {**tp2, "out": str(root / "bf16_true"), "precision": "bf16-true", "dp": 2, "tp": 1},
        {**tp2, "out": str(root / "compile"), "compile": {"backend": "aot_eager"}},
        {**tp2, "out": str(root / "checkpointing"), "checkpointing": True},
        {"strategy": "model_parallel", "out": str(root / "unsharded"), "dp": 1, "tp": 2, "mistake": "unsharded"},
    ]  # fmt: skip
    _jobs(root, 2, runs)


def _assert_parity(out: Path, reference: dict[str, Any], dp: int, tp: int) -> None:
    records = [_record(out, rank) for rank in range(dp * tp)]
    for rank, record in enumerate(records):
        assert record["dp_rank"] == rank // tp
        # tensor-parallel peers compute the same loss from the same batch
        assert record["losses"] == records[(rank // tp) * tp]["losses"]
        torch.testing.assert_close(record["grad_norms"], reference["grad_norms"], **FP32_TOL)
        torch.testing.assert_close(record["max_grads"], reference["max_grads"], **FP32_TOL)  # the inf-norm
        logged = [step["loss_mean"] for step in record["logged"]]  # sync_dist: the mean over replicas
        torch.testing.assert_close(logged, reference["losses"], **FP32_TOL)
        # reduce_fx="sum" over the data replicas only: the global batch, not tp times it
        assert [step["samples"] for step in record["logged"]] == [float(job.GLOBAL_BATCH)] * STEPS
    per_replica = torch.tensor([records[r * tp]["losses"] for r in range(dp)])
    torch.testing.assert_close(per_replica.mean(0).tolist(), reference["losses"], **FP32_TOL)
    assert reference["grad_norms"][0] > CLIP  # so the clipping was exercised


@pytest.mark.multiprocess
def test_2x2_mesh_loss_and_grad_norm_equal_one_process(two_d: Path, reference: dict[str, Any]) -> None:
    _assert_parity(two_d / "A", reference, dp=2, tp=2)


@pytest.mark.multiprocess
def test_fsdp2_strategy_with_a_tp_plan_equals_one_process(two_d: Path, reference: dict[str, Any]) -> None:
    # the strategy applies the plan over the TP pairs, then activation checkpointing of each block
    # (checkpoint_wrapper around tensor-parallel layers), then shards over the DP pairs
    _assert_parity(two_d / "fsdp2_tp", reference, dp=2, tp=2)


@pytest.mark.multiprocess
def test_a_hugging_face_model_trains_by_its_own_plan(two_d: Path, hf_reference: dict[str, Any]) -> None:
    # base_model_tp_plan / _tp_plan (colwise q/k/v/gate/up, rowwise o/down, vocabulary-split
    # embedding, colwise_gather_output head), grouped-query attention, rotary embeddings: 2x2
    _assert_parity(two_d / "hf_auto", hf_reference, dp=2, tp=2)


@pytest.mark.multiprocess
@pytest.mark.parametrize("eager", ["A", "fsdp2_tp", "hf_auto"])
def test_meta_device_init_after_sharding_equals_eager_init_bitwise(two_d: Path, eager: str) -> None:
    # A: ModelParallelStrategy, configure_model builds under torch.device("meta") and splits;
    # fsdp2_tp: FSDP2Strategy(tensor_parallel_size=2, empty_init=True); hf_auto: the same with
    # tp_plan="auto" on the Hugging Face-style model (a rotary buffer, init_weights setting its
    # norms). Each parameter is initialised whole, children first as the constructors ran, and
    # split after: the weights training starts from, and then the losses, are eager's bit for bit.
    meta = f"{eager}_meta"
    got, want = (torch.load(two_d / run / "init.pt", weights_only=False)["model"] for run in (meta, eager))
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name
    for rank in range(4):
        assert _record(two_d / meta, rank)["losses"] == _record(two_d / eager, rank)["losses"]


@pytest.mark.multiprocess
def test_clipping_over_both_meshes_says_nothing_of_sequential_collectives(two_d: Path, tp_only: Path) -> None:
    # a norm partial over both mesh dimensions: DTensor warned on every process when it reduced
    # them (full_tensor), and when torch.stack of such norms redistributed them one by one
    for root in (two_d, tp_only):
        assert "sequential all_reduce" not in (root / "output.txt").read_text()


@pytest.mark.multiprocess
def test_the_layout_configure_model_made_is_planned_as_the_strategy_plans_its_own(
    two_d: Path, tp_only: Path
) -> None:
    # the same model and plan, split by hand in configure_model (model_parallel) or by the strategy
    # (FSDP2Strategy(tensor_parallel_size=2)): the same blocks, parameters and per-process estimate
    by_hand, by_strategy = _record(two_d / "A", 0)["plan"], _record(two_d / "fsdp2_tp", 0)["plan"]
    blocks = [f"model.layers.{i}" for i in range(job.LAYERS)]
    assert [by_hand["units"][b] for b in blocks] == [by_strategy["units"][b] for b in blocks]
    assert sum(by_hand["units"].values()) == sum(by_strategy["units"].values())
    assert by_hand["estimate"] == by_strategy["estimate"] > 0
    # tensor parallel alone (1 x 2, no fully_shard): one unit, nothing gathered, each parameter
    # split in two: float32 parameter, gradient and AdamW's two moments, 16 bytes an element
    tp_alone = _record(tp_only / "tp2", 0)["plan"]
    total = sum(by_hand["units"].values())
    assert tp_alone["units"] == {"": total}
    assert tp_alone["estimate"] == -(-total // 2) * 16
    # activation checkpointing applied in configure_model is found where it was applied
    assert by_hand["checkpointed"] == []
    assert (
        _record(tp_only / "checkpointing", 0)["plan"]["checkpointed"] == by_strategy["checkpointed"] == blocks
    )


@pytest.mark.multiprocess
def test_tensor_parallel_only_loss_equals_one_process(tp_only: Path, reference: dict[str, Any]) -> None:
    _assert_parity(tp_only / "tp2", reference, dp=1, tp=2)


@pytest.mark.multiprocess
@pytest.mark.parametrize("run", ["compile", "checkpointing"])
def test_compile_and_activation_checkpointing_keep_the_loss(
    tp_only: Path, reference: dict[str, Any], run: str
) -> None:
    # compile= with aot_eager (traces the same graphs as inductor without building kernels);
    # checkpoint_wrapper per block after TP (in configure_model). Both at once fail in torch 2.13
    # (docs/fsdp/2d-parallel.md)
    _assert_parity(tp_only / run, reference, dp=1, tp=2)


@pytest.mark.multiprocess
def test_bf16_precisions_stay_close(tp_only: Path, reference: dict[str, Any]) -> None:
    losses = _record(tp_only / "bf16", 0)["losses"]  # 1 x 2, bf16-mixed
    torch.testing.assert_close(losses, reference["losses"], rtol=2e-3, atol=0.0)
    assert losses != reference["losses"]  # autocast did run in bfloat16
    # 2 x 1, bf16-true: the module built in __init__ is cast (a bfloat16 loss has 8 bits of mantissa)
    records = [_record(tp_only / "bf16_true", rank)["losses"] for rank in range(2)]
    losses = torch.tensor(records).mean(0).tolist()
    torch.testing.assert_close(losses, reference["losses"], rtol=2e-2, atol=0.0)
    assert all(torch.tensor(r).to(torch.bfloat16).tolist() == r for r in records)


@pytest.mark.multiprocess
def test_sampler_splits_data_over_data_parallel_ranks_only(two_d: Path, reference: dict[str, Any]) -> None:
    records = [_record(two_d / "A", rank) for rank in range(4)]
    assert [r["sampler"] for r in records] == [{"num_replicas": 2, "rank": rank // 2} for rank in range(4)]
    assert records[0]["batches"] == records[1]["batches"] and records[2]["batches"] == records[3]["batches"]
    for step, whole in enumerate(reference["batches"]):
        first, second = records[0]["batches"][step], records[2]["batches"][step]
        assert len(first) == len(second) == job.GLOBAL_BATCH // 2
        assert sorted(first + second) == sorted(whole)  # the replicas split each global batch


@pytest.mark.multiprocess
def test_resume_at_the_same_layout_is_bitwise_identical(two_d: Path) -> None:
    # 6 steps with async sharded saves at 3 and 6, against 3 + load + 3
    for rank in range(4):
        assert _record(two_d / "resumed", rank)["losses"] == _record(two_d / "A", rank)["losses"][3:]
    assert_same_state(_final(two_d / "resumed"), _final(two_d / "A"))


@pytest.mark.multiprocess
@pytest.mark.parametrize("layout", ["fsdp2", "tp4", "fsdp", "full"])
def test_a_2x2_sharded_checkpoint_loads_at_other_layouts(two_d: Path, layout: str) -> None:
    # fsdp2: 4x1 FSDP2 only; tp4: 1x4 tensor parallel only; fsdp: FSDP1 ShardedTensors; full: 2x2
    # again, writing full checkpoints. loaded.pt: the state when fit started, after the load
    assert_same_state(torch.load(two_d / layout / "loaded.pt", weights_only=False), _final(two_d / "A"))


@pytest.mark.multiprocess
def test_training_goes_on_at_another_layout_where_2x2_left_off(
    two_d: Path, reference: dict[str, Any]
) -> None:
    # 2x2 wrote step 6 in the middle of epoch 1 (2 replicas of 4 sequences); 4x1 fsdp2 (4 of 2)
    # reads on from the same position of the epoch's order and trains as one process would
    records = [_record(two_d / "fsdp2", rank) for rank in range(4)]
    for step, whole in enumerate(reference["more_batches"]):
        assert sorted(i for r in records for i in r["batches"][step]) == sorted(whole)
    losses = torch.tensor([r["losses"] for r in records]).mean(0).tolist()
    torch.testing.assert_close(losses, reference["more_losses"], **FP32_TOL)


@pytest.mark.multiprocess
def test_a_2x2_sharded_checkpoint_loads_in_one_process(two_d: Path, tmp_path: Path) -> None:
    spec = {"out": str(tmp_path), "strategy": "single", "max_steps": STEPS}
    trainer = job.run({**spec, "resume": str(two_d / "A/ckpts/epoch=1-step=6.ckpt")}, 1)
    assert trainer.global_step == STEPS
    assert_same_state(_final(tmp_path), _final(two_d / "A"))


@pytest.mark.multiprocess
def test_a_full_checkpoint_from_2d_loads_into_the_plain_module(two_d: Path) -> None:
    checkpoint = torch.load(two_d / "full.ckpt", weights_only=True)
    assert checkpoint["world_size"] == 4 and checkpoint["data_parallel_size"] == 2
    plain = job.LlamaModule()
    plain.load_state_dict(checkpoint["state_dict"])  # strict: no wrapper prefixes, whole tensors
    expected = _final(two_d / "A")["model"]
    for key, value in plain.state_dict().items():
        assert torch.equal(value, expected[key]), key


@pytest.mark.multiprocess
def test_consolidate_inspect_and_export_a_2d_checkpoint(two_d: Path, tmp_path: Path) -> None:
    sharded, expected = two_d / "A/ckpts/epoch=1-step=6.ckpt", _final(two_d / "A")["model"]
    found = tools.inspect(sharded, verify_checksums=True)
    assert (found.format, found.complete, found.verified, found.world_size) == ("sharded", True, True, 4)
    assert found.strategy == "model_parallel" and found.global_step == STEPS
    shapes = {info.name: tuple(info.shape) for info in found.tensors}
    assert shapes["model.model.layers.0.attention.wq.weight"] == (job.DIM, job.DIM)  # whole, not a shard
    full = torch.load(tools.consolidate(sharded, tmp_path / "full.ckpt"), weights_only=True)
    assert full["state_dict"].keys() == expected.keys()
    for key, value in full["state_dict"].items():
        assert torch.equal(value, expected[key]), key
    exported = tools.load_exported(tools.export_safetensors(sharded, tmp_path / "model.safetensors"))
    assert all(torch.equal(exported[key], expected[key]) for key in expected)


@pytest.mark.multiprocess
def test_a_model_configure_model_did_not_shard_is_refused(tp_only: Path, two_d: Path) -> None:
    error = (tp_only / "unsharded" / "error.txt").read_text()
    assert "ModelParallelStrategy does not shard models itself" in error
    assert "parallelize_module(layer, self.device_mesh['tensor_parallel'], plan)" in error
    error = (two_d / "root" / "error.txt").read_text()
    assert "not sharded over the data-parallel mesh (model.tok_embeddings.weight" in error
    assert "fully_shard(model, mesh=self.device_mesh['data_parallel']) to the root module" in error


# ------------------------------------------------------------------------------ in this process
def test_registered_as_model_parallel() -> None:
    strategy = STRATEGY_REGISTRY.get("model_parallel")
    assert isinstance(strategy, ModelParallelStrategy) and strategy.state_dict_type == "sharded"
    assert ModelParallelStrategy(save_distributed_checkpoint=False).state_dict_type == "full"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"data_parallel_size": 0}, r"data_parallel_size=0 is invalid: pass a positive int .* or 'auto'"),
        ({"tensor_parallel_size": "2"}, r"tensor_parallel_size='2' is invalid: pass a positive int"),
        ({"tensor_parallel_size": True}, r"tensor_parallel_size=True is invalid"),
        (
            {"save_distributed_checkpoint": "yes"},
            r"save_distributed_checkpoint='yes' must be True .* or False",
        ),
        (
            {"save_distributed_checkpoint": False, "async_save": True},
            r"async_save=True writes sharded checkpoints .* Pass save_distributed_checkpoint=True",
        ),
    ],
)
def test_bad_arguments_say_what_is_accepted(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(MisconfigurationError, match=match):
        ModelParallelStrategy(**kwargs)


@pytest.mark.parametrize(
    ("dp", "tp", "said"),
    [
        (3, 2, r"data_parallel_size=3, tensor_parallel_size=2"),
        (3, "auto", r"data_parallel_size=3, tensor_parallel_size='auto'"),
        ("auto", 3, r"data_parallel_size='auto', tensor_parallel_size=3"),
    ],
)
def test_sizes_that_do_not_cover_the_job_are_refused(tmp_path: Path, dp: Any, tp: Any, said: str) -> None:
    with pytest.raises(
        MisconfigurationError, match=said + r"\) cannot lay out the job's 4 processes.* equal 4"
    ):
        fullshard.Trainer(
            accelerator="cpu", devices=4, strategy=ModelParallelStrategy(dp, tp), default_root_dir=tmp_path
        )


@pytest.mark.parametrize(
    ("dp", "tp", "expected"), [("auto", "auto", (1, 4)), (2, "auto", (2, 2)), ("auto", 1, (4, 1))]
)
def test_auto_sizes(tmp_path: Path, dp: Any, tp: Any, expected: tuple[int, int]) -> None:
    # "auto" as Lightning: tensor parallel inside the machine, data parallel across machines;
    # one size given, the other fills the job
    strategy = ModelParallelStrategy(dp, tp)
    fullshard.Trainer(accelerator="cpu", devices=4, strategy=strategy, default_root_dir=tmp_path)
    assert (strategy.data_parallel_size, strategy.tensor_parallel_size) == expected
    assert strategy.distributed_sampler_kwargs == {"num_replicas": expected[0], "rank": 0}


@pytest.mark.parametrize("tp", [2, 4])
def test_fsdp2_tensor_parallel_is_a_preset_of_model_parallel(tmp_path: Path, tp: int) -> None:
    # one 2-D path: FSDP2Strategy(tensor_parallel_size=T) lays the job out as
    # ModelParallelStrategy(data_parallel_size="auto", tensor_parallel_size=T)
    def configured(strategy: Any) -> Any:
        fullshard.Trainer(accelerator="cpu", devices=4, strategy=strategy, default_root_dir=tmp_path)
        return strategy

    fsdp2 = configured(FSDP2Strategy(tensor_parallel_size=tp, tp_plan={"layer": "colwise"}))
    model_parallel = configured(ModelParallelStrategy("auto", tp))
    assert fsdp2.layout == model_parallel.layout
    assert fsdp2.layout.mesh_dims == ("data_parallel", "tensor_parallel")
    assert (
        fsdp2.distributed_sampler_kwargs
        == model_parallel.distributed_sampler_kwargs
        == {
            "num_replicas": 4 // tp,
            "rank": 0,
        }
    )
    # a layout planned ahead for another job size goes through the same function
    assert fsdp2.layout_for(8).mesh_shape == (8 // tp, tp)
    odd = 6 if tp == 4 else 7  # a size tp does not divide
    with pytest.raises(
        MisconfigurationError,
        match=rf"FSDP2Strategy\(tensor_parallel_size={tp}\) cannot lay out the job's {odd} processes: "
        rf"data_parallel_size x tensor_parallel_size must equal {odd}",
    ):
        fsdp2.layout_for(odd)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_with_nccl(tmp_path: Path, reference: dict[str, Any]) -> None:
    # tensor parallel over the GPUs there are (at most 2; one GPU: a 1x1 mesh), NCCL, against
    # the CPU reference (CUDA's kernels sum in another order: a looser tolerance)
    devices = min(torch.cuda.device_count(), 2)
    spec = {
        "strategy": "model_parallel",
        "dp": 1,
        "tp": devices,
        "max_steps": STEPS,
        "clip": CLIP,
        "accelerator": "cuda",
    }
    (tmp_path / "runs.json").write_text(json.dumps([{**spec, "out": str(tmp_path / "cuda")}]))
    check_ok(
        run_script("model_parallel_job.py", "--devices", str(devices), "--runs", str(tmp_path / "runs.json"))
    )
    losses = _record(tmp_path / "cuda", 0)["losses"]
    torch.testing.assert_close(losses, reference["losses"], rtol=1e-4, atol=1e-5)


def test_fsdp2_tensor_parallel_arguments_and_wrap_plan() -> None:
    plan = job.tp_plan("model.")
    with pytest.raises(MisconfigurationError, match=r"tensor_parallel_size=2 needs tp_plan=: .* or 'auto'"):
        FSDP2Strategy(tensor_parallel_size=2)
    with pytest.raises(MisconfigurationError, match=r"tensor_parallel_size=0 is invalid: pass the number"):
        FSDP2Strategy(tensor_parallel_size=0, tp_plan=plan)
    with pytest.raises(MisconfigurationError, match=r"tp_plan= was given with tensor_parallel_size=1"):
        FSDP2Strategy(tp_plan=plan)
    with pytest.raises(
        MisconfigurationError, match=r"tp_plan\['model.norm'\] is 'sideways', neither a torch"
    ):
        FSDP2Strategy(tensor_parallel_size=2, tp_plan={"model.norm": "sideways"})
    FSDP2Strategy(tensor_parallel_size=2, tp_plan={"model.norm": "colwise"})  # transformers' style strings
    # "auto" for a model without a Hugging Face plan: refused with the fix when the strategy applies it
    with pytest.raises(
        MisconfigurationError, match=r"tp_plan='auto' reads .* but LlamaModule has none\. Pass"
    ):
        parallelize(job.LlamaModule(), None, "auto")
    with pytest.raises(
        MisconfigurationError, match=r"tp_plan='colwise' is not a plan\. Pass a dict from module"
    ):
        FSDP2Strategy(tensor_parallel_size=2, tp_plan="colwise")
    with pytest.raises(
        MisconfigurationError, match=r"sharding_strategy='HYBRID_SHARD' and device_mesh= cannot"
    ):
        FSDP2Strategy(tensor_parallel_size=2, tp_plan=plan, sharding_strategy="HYBRID_SHARD")
    # compile= with activation checkpointing of TP layers: torch 2.13 fails at the first backward
    checkpointed = FSDP2Strategy(
        tensor_parallel_size=2, tp_plan=plan, activation_checkpointing_policy={job.Block}
    )
    with pytest.raises(
        MisconfigurationError, match=r"compile= with activation checkpointing of tensor-parallel"
    ):
        fullshard.Trainer(
            accelerator="cpu", devices=4, strategy=checkpointed, compile={"backend": "aot_eager"}
        )
    fullshard.Trainer(accelerator="cpu", devices=4, strategy=checkpointed, compile=False)  # off: fine
    # the memory estimate per process: each parameter split 2 ways by TP, then 2 ways by FSDP
    model = job.LlamaModule()
    tp = FSDP2Strategy(auto_wrap_policy={job.Block}, tensor_parallel_size=2, tp_plan=plan).plan_wrapping(
        model, world_size=4
    )
    alone = FSDP2Strategy(auto_wrap_policy={job.Block}).plan_wrapping(model, world_size=4)
    assert (tp.shard_size, tp.tensor_parallel_size) == (2, 2)
    assert "FULL_SHARD over 2 of 4 rank(s) x tensor parallel 2" in tp.summary()
    assert tp.estimate.optimizer == alone.estimate.optimizer  # sharded state: a quarter either way
    assert tp.estimate.params < alone.estimate.params  # a unit is gathered within its TP slice only
