"""Memory that is not tensors in the plan ([Note: memory that is not tensors] in
fullshard/planner/overhead.py): the overhead model's terms, the largest unit it is given, and a
row that fits only with its overhead counted. The check of the model against a real 2-process
run's resident set is in tests/test_planner.py (plan="auto" in a two-process job)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fullshard.planner import Candidate, plan
from fullshard.planner import overhead as model
from fullshard.planner.result import fmt_bytes
from test_planner import Block, Net, batch

MIB = 2**20


def test_the_cpu_overhead_is_the_measured_constant_and_a_term_per_peer() -> None:
    base = model.cpu_process_overhead(1, 0)
    assert base == model.CPU_BASE and 64 * MIB <= base <= 256 * MIB  # measured: about 90 MiB
    assert model.cpu_process_overhead(4, 0) - model.cpu_process_overhead(2, 0) == 2 * model.CPU_PER_PEER
    grown = model.cpu_process_overhead(2, 100 * MIB) - model.cpu_process_overhead(2, 0)
    assert grown == int(model.CPU_PER_UNIT_BYTE * 100 * MIB)
    assert model.process_overhead("cpu", world_size=4, largest_unit=0, tensor_peak=2**40) == (
        model.cpu_process_overhead(4, 0)
    )  # on CPU nothing scales with the tensors: their staging copies are tensors, counted


def test_the_cuda_overhead_is_context_nccl_with_peers_and_the_allocators_reserve() -> None:
    alone = model.process_overhead("cuda", world_size=1, largest_unit=0, tensor_peak=0)
    assert alone == model.CUDA_CONTEXT  # no communicator with one process
    eight = model.process_overhead("cuda", world_size=8, largest_unit=0, tensor_peak=10 * 2**30)
    assert eight == model.CUDA_CONTEXT + model.CUDA_NCCL + int(model.CUDA_RESERVE_FRACTION * 10 * 2**30)


class Tied(nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, 32)
        self.blocks = nn.ModuleList(Block(32) for _ in range(2))
        self.out = nn.Linear(32, vocab, bias=False)
        self.out.weight = self.embed.weight


def test_the_largest_unit_is_a_block_or_the_root_with_shared_parameters_once() -> None:
    block = sum(p.numel() for p in Block(32).parameters()) * 4
    assert model.largest_unit_bytes(Net(depth=3), ("Block",)) == block  # the root: norm and head, smaller
    small, big = Tied(8), Tied(1000)
    assert model.largest_unit_bytes(small, ("Block",)) == block
    assert model.largest_unit_bytes(big, ("Block",)) == 1000 * 32 * 4  # the tied table, once
    with torch.device("meta"):
        assert model.largest_unit_bytes(Tied(1000), ("Block",)) == 1000 * 32 * 4


def test_a_row_fits_only_with_what_is_not_a_tensor_and_the_headroom_on_top() -> None:
    """Between the tensor peak and the process peak the row does not fit, nor at the process peak
    with no room for the headroom; above that, it does."""
    candidate = Candidate("fsdp2", "FULL_SHARD", ("Block",), 0, False)
    kwargs: dict[str, Any] = dict(
        devices=2, device_type="cpu", candidates=[candidate], workers=1, headroom=0.05
    )
    roomy = plan(Net(depth=2), batch(), device_memory="1GiB", **kwargs)
    row = roomy.rows[0]
    assert row.overhead == model.cpu_process_overhead(2, model.largest_unit_bytes(Net(depth=2), ("Block",)))
    assert row.process_peak == row.peak + row.overhead and row.overhead > 10 * row.peak
    between = plan(Net(depth=2), batch(), device_memory=int((row.peak + row.overhead // 2) / 0.95), **kwargs)
    assert between.choice is None and not between.rows[0].fits
    assert f"needs {fmt_bytes(row.process_peak)} of {fmt_bytes(between.budget)}" in between.table()
    assert plan(Net(depth=2), batch(), device_memory=row.process_peak, **kwargs).choice is None
    enough = plan(Net(depth=2), batch(), device_memory=int(row.process_peak / 0.95) + 1, **kwargs)
    assert enough.choice is not None and enough.choice.process_peak <= enough.budget
    assert enough.table().splitlines()[1].split()[:3] == ["configuration", "process", "tensors"]
