"""Memory that is not tensors in the plan ([Note: memory that is not tensors] in
fullshard/planner/overhead.py): the overhead model's terms, and a row that fits only with its
overhead counted. The model against a real 2-process run's resident set: tests/test_planner.py
(plan="auto" in a two-process job)."""

from __future__ import annotations

from typing import Any

from fullshard.planner import Candidate, plan
from fullshard.planner import overhead as model
from fullshard.planner.result import fmt_bytes
from test_planner import Net, batch

MIB = 2**20


def test_the_cpu_overhead_is_the_measured_constant_and_a_term_per_process() -> None:
    base = model.cpu_process_overhead(1)
    assert base == model.CPU_BASE and 64 * MIB <= base <= 256 * MIB  # measured: 88-95 MiB
    assert model.cpu_process_overhead(4) - model.cpu_process_overhead(2) == 2 * model.CPU_PER_PEER > 0
    assert model.process_overhead("cpu", world_size=4, tensor_peak=2**40) == model.cpu_process_overhead(4)
    # on CPU nothing scales with the tensors: staging copies and gathered units are tensors, counted


def test_the_cuda_overhead_is_context_nccl_with_peers_and_the_allocators_reserve() -> None:
    alone = model.process_overhead("cuda", world_size=1, tensor_peak=0)
    assert alone == model.CUDA_CONTEXT  # no communicator with one process
    eight = model.process_overhead("cuda", world_size=8, tensor_peak=10 * 2**30)
    assert eight == model.CUDA_CONTEXT + model.CUDA_NCCL + int(model.CUDA_RESERVE_FRACTION * 10 * 2**30)


def test_a_row_fits_only_with_what_is_not_a_tensor_and_the_headroom_on_top() -> None:
    """Between the tensor peak and the process peak the row does not fit, nor at the process peak
    with no room for the headroom; above that, it does."""
    candidate = Candidate("fsdp2", "FULL_SHARD", ("Block",), 0, False)
    kwargs: dict[str, Any] = dict(
        devices=2, device_type="cpu", candidates=[candidate], workers=1, headroom=0.05
    )
    roomy = plan(Net(depth=2), batch(), device_memory="1GiB", **kwargs)
    row = roomy.rows[0]
    assert row.overhead == model.cpu_process_overhead(2)
    assert row.process_peak == row.peak + row.overhead and row.overhead > 10 * row.peak
    between = plan(Net(depth=2), batch(), device_memory=int((row.peak + row.overhead // 2) / 0.95), **kwargs)
    assert between.choice is None and not between.rows[0].fits
    assert f"needs {fmt_bytes(row.process_peak)} of {fmt_bytes(between.budget)}" in between.table()
    assert plan(Net(depth=2), batch(), device_memory=row.process_peak, **kwargs).choice is None
    enough = plan(Net(depth=2), batch(), device_memory=int(row.process_peak / 0.95) + 1, **kwargs)
    assert enough.choice is not None and enough.choice.process_peak <= enough.budget
    assert enough.table().splitlines()[1].split()[:3] == ["configuration", "process", "tensors"]
