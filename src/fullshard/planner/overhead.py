"""Memory a training process holds that is not a tensor the planner counts: on CPU, what gloo,
glibc's heaps and the code fullshard and torch load during ``fit`` add to a process; on CUDA, the
CUDA context, NCCL's buffers and the caching allocator's reserve. The plan adds it to each row's
predicted tensor peak (:attr:`MemoryPlanRow.process_peak`) before deciding whether a row fits.

[Note: memory that is not tensors]
CPU (measured: benchmarks/process_overhead.py, docs/benchmarks.md "Memory that is not tensors").
What a run adds to a process, from before the Trainer is made (torch and fullshard imported, no
tensor of the model yet) to the end of ``fit``, is the process's peak resident set size less its
size then: the *growth*. It is the planner's tensor peak plus a part that is not tensors, and
that part was measured under fullshard's Trainer with FSDP2 and FSDP1 on gloo, FULL_SHARD, every
block a unit, 1 (the single-device Trainer), 2 and 4 processes, AdamW, on MLPs whose largest unit
held 2 and 32 MiB of parameters; checked on MLPs of 72 MiB units and a Llama of 296 MiB (figures:
FIGURES). Of it:

- nearly all is a constant: the Python objects of the modules the Trainer, the strategies and
  torch's distributed and optimizer code import during ``fit``, and what they make once; they
  live in glibc's heap, in use to the end (``mallinfo2``: free bytes in the heap stay at 1-3 MiB).
  The single-device Trainer adds as much as FSDP: it is not gloo;
- the process group adds a few MiB a process, mostly file-backed (gloo's code, shared between
  processes) and grows little with the number of processes: gloo's pairs keep small buffers;
- staging copies for collectives and the gathered units are tensors, counted by the planner
  (glibc maps each one afresh and returns it under fullshard's fixed ``cpu_mmap_threshold``:
  [Note: CPU memory under FSDP]); with ``cpu_mmap_threshold=None`` they stay in the heap and
  this model does not hold.

CUDA (not measured yet: benchmarks/gpu_check.py's ``llama-fsdp2`` part reads the context, NCCL's
share and the allocator's reserve on the next GPU it runs on; until then these are conservative
values from common experience, not measurements): the CUDA context with torch's kernels loaded
lazily is 0.3-0.6 GiB a process; an NCCL communicator keeps buffers for each of its channels
(``NCCL_BUFFSIZE``, 4 MiB, per protocol and peer), a few hundred MiB; the caching allocator
reserves more than the tensors it holds (blocks split and cached), 5-10% of the peak on a
training step.
"""

from __future__ import annotations

from torch import nn

MIB = 2**20

# CPU, from the fit in FIGURES (rounded up to a MiB):
#: what a run adds to a process beyond tensors whatever its size: code imported during ``fit``
#: and its objects, autograd's and the optimizer's bookkeeping, the Trainer's own state
CPU_BASE = 91 * MIB
#: each other process of the group: gloo's pair of each peer (buffers, its thread's stack)
CPU_PER_PEER = 1 * MIB
#: per byte of the largest unit's parameters (the gathered copy's neighbours in the heap)
CPU_PER_UNIT_BYTE = 0.0

# CUDA, not measured (see the note): conservative values until benchmarks/gpu_check.py reads them
#: the CUDA context of a process, torch's kernels loaded lazily (0.3-0.6 GiB seen commonly): high
CUDA_CONTEXT = 1024 * MIB
#: NCCL's buffers of the process's communicators, where there is more than one process
CUDA_NCCL = 512 * MIB
#: the caching allocator's reserved-but-unused bytes, as a fraction of the tensor peak
CUDA_RESERVE_FRACTION = 0.10


def cpu_process_overhead(world_size: int, largest_unit: int) -> int:
    """Bytes a CPU process (gloo) adds during ``fit`` beyond its tensors ([Note: memory that is
    not tensors]): ``world_size`` processes in the job, ``largest_unit`` bytes of parameters in
    its largest FSDP unit."""
    return int(CPU_BASE + CPU_PER_PEER * (world_size - 1) + CPU_PER_UNIT_BYTE * largest_unit)


def cuda_process_overhead(world_size: int, tensor_peak: int) -> int:
    """Device bytes a CUDA process holds beyond its tensors: the context, NCCL's buffers (more
    than one process) and the caching allocator's reserve over ``tensor_peak``. Not measured yet:
    conservative ([Note: memory that is not tensors])."""
    nccl = CUDA_NCCL if world_size > 1 else 0
    return int(CUDA_CONTEXT + nccl + CUDA_RESERVE_FRACTION * tensor_peak)


def process_overhead(device_type: str, *, world_size: int, largest_unit: int, tensor_peak: int) -> int:
    """Bytes beyond the tensors of one process of a ``device_type`` (``"cpu"`` or ``"cuda"``) job."""
    if device_type == "cpu":
        return cpu_process_overhead(world_size, largest_unit)
    return cuda_process_overhead(world_size, tensor_peak)


def largest_unit_bytes(model: nn.Module, wrap: tuple[str, ...]) -> int:
    """Parameter bytes of the largest FSDP unit of ``model`` (on any device, meta included): each
    outermost module whose class is in ``wrap`` is a unit, the root holds the rest. A parameter
    shared between modules counts once."""
    seen: set[int] = set()

    def size(module: nn.Module) -> int:
        total = 0
        for parameter in module.parameters():
            if id(parameter) not in seen:
                seen.add(id(parameter))
                total += parameter.numel() * parameter.element_size()
        return total

    units: list[int] = []

    def visit(module: nn.Module) -> None:
        for child in module.children():
            if type(child).__name__ in wrap:
                units.append(size(child))
            else:
                visit(child)

    visit(model)
    return max([*units, size(model)])
