"""A step's cost: bytes each process moves and FLOPs it computes, turned into seconds.

[Note: the step-time model]
Per process and optimizer step: compute time is the step's FLOPs (measured on the simulated step,
activation recomputation included) over the device's FLOP/s. Communication is what the sharding
moves, at ring-collective volumes: FULL_SHARD all-gathers the parameters twice (forward and
backward) and reduce-scatters the gradients; SHARD_GRAD_OP all-gathers once; NO_SHARD all-reduces
the gradients; HYBRID_SHARD does FULL_SHARD within a node and all-reduces its shard of the
gradients across nodes. A collective spanning nodes runs at the inter-node bandwidth. FSDP
overlaps communication with compute on CUDA (prefetching on streams), so the step takes the longer
of the two; a CPU process with gloo computes nothing while it waits, so there the step takes
their sum (``DeviceSpec.overlap``). Each collective also costs a fixed latency: FULL_SHARD runs
two all-gathers and a reduce-scatter per unit, SHARD_GRAD_OP one of each, NO_SHARD one
all-reduce, HYBRID_SHARD FULL_SHARD's and an all-reduce; on small models on CPU these dominate.
CPU offload adds the host copies and the host optimizer step, which are not overlapped. It ranks
configurations; it is not a profiler (docs/fsdp/plan.md, "Reading the table").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fullshard.planner.config import Candidate, DeviceSpec

if TYPE_CHECKING:
    from fullshard.strategies.parallel_layout import ParallelLayout


@dataclass(frozen=True)
class StepCost:
    """Bytes a process sends per step, FLOPs it computes, and the modelled step time."""

    comm_bytes: int
    host_bytes: int
    flops: int
    seconds: float


def step_cost(
    candidate: Candidate,
    *,
    numel: int,
    flops: int,
    compute_bytes: int,
    reduce_bytes: int,
    param_bytes: int,
    layout: ParallelLayout,
    num_nodes: int,
    device: DeviceSpec,
    units: int = 1,
) -> StepCost:
    """The cost of one optimizer step of ``candidate`` with ``units`` FSDP units (the wrapped
    blocks and the root; see [Note: the step-time model]), its processes laid out as ``layout``
    (:meth:`Candidate.layout <fullshard.planner.config.Candidate.layout>`) over ``num_nodes`` nodes."""
    world, shard, replicas = layout.world_size, layout.shards, layout.replicas
    params, grads = numel * compute_bytes, numel * reduce_bytes
    intra, inter = device.intra_node_bandwidth, device.inter_node_bandwidth
    spans_nodes = num_nodes > 1
    seconds_comm = 0.0
    comm = 0.0
    if candidate.sharding == "NO_SHARD":
        comm = 2 * grads * (world - 1) / world
        seconds_comm = comm / (inter if spans_nodes else intra)
    elif candidate.sharding == "HYBRID_SHARD":  # a replica per node, sharded within it
        within = (2 * params + grads) * (shard - 1) / shard
        across = 2 * (grads / shard) * (replicas - 1) / replicas
        comm = within + across
        seconds_comm = within / intra + across / inter
    else:
        gathers = 2 if candidate.sharding == "FULL_SHARD" else 1
        comm = (gathers * params + grads) * (shard - 1) / shard
        seconds_comm = comm / (inter if spans_nodes else intra)
    host = 0.0
    seconds_host = 0.0
    if candidate.cpu_offload and candidate.sharding != "NO_SHARD":
        shard_numel = numel / shard
        gathers = 2 if candidate.sharding in ("FULL_SHARD", "HYBRID_SHARD") else 1
        host = shard_numel * (gathers * param_bytes + reduce_bytes)
        # the host optimizer step reads and writes the shard, its gradient and two states in float32
        seconds_host = (
            host / device.host_bandwidth + shard_numel * 4 * 4 * 2 / device.host_optimizer_bandwidth
        )
    per_unit = {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2, "NO_SHARD": 1, "HYBRID_SHARD": 4}[candidate.sharding]
    seconds_comm += per_unit * units * device.collective_latency
    seconds_compute = flops / device.flops
    overlapped = max(seconds_compute, seconds_comm) if device.overlap else seconds_compute + seconds_comm
    seconds = overlapped + seconds_host
    return StepCost(int(comm), int(host), flops, seconds)
