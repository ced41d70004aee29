"""Memory a training process holds that is not a tensor the planner counts: on CPU, what gloo,
glibc's heaps and the code fullshard and torch load during ``fit`` add to a process; on CUDA, the
CUDA context, NCCL's buffers and the caching allocator's reserve. The plan adds it to each row's
predicted tensor peak (:attr:`MemoryPlanRow.process_peak`) before deciding whether a row fits.

[Note: memory that is not tensors]
CPU (measured: benchmarks/process_overhead.py, docs/benchmarks.md "Memory that is not tensors").
What a run adds to a process, from before the Trainer is made (torch and fullshard imported, no
tensor of the model yet) to the end of ``fit``, is the process's peak resident set size
(``VmHWM``) less its size then: the *growth*. It is the planner's tensor peak plus a part that is
not tensors. Measured 2026-11-28 on 2 shared cores (x86_64, Intel Xeon; torch 2.13.0+cpu, glibc,
transparent huge pages on request), fullshard's Trainer, FULL_SHARD, every block a unit, AdamW,
3 steps, 2 runs of each case (they agreed within 1 MiB), rank 0:

- fitted on MLPs whose largest unit holds 2 and 32 MiB of parameters, 2 and 4 processes: FSDP2
  92-93 MiB, FSDP1 88-89 MiB; least squares 90.6 MiB + 0.1 MiB a process beyond the first
  - 0.003 x the largest unit's bytes: no measurable term in the unit's size, a tiny one in the
  number of processes;
- checked on an MLP of 72 MiB units (297 MiB of parameters) and a Llama of 296 MiB (its
  embedding and head in the root unit, 188 MiB): FSDP2 94-95 MiB, FSDP1 87-92 MiB; the process
  peak below within 0.3% of the growth in 7 of 8 cases and 4.9% under in the eighth (FSDP1, the
  Llama, 4 processes: 139 MiB, which is tensors the FSDP1 rows miss, priced from FSDP2's
  simulation, not more of this);
- the single-device Trainer adds as much (83 MiB beyond its tensors): it is not gloo. The process
  group itself adds 3-6 MiB, mostly file-backed (gloo's code, shared between processes), and
  glibc's heaps keep 1-3 MiB free at the end: nearly all of the constant is the ~800 modules the
  Trainer, the strategies and torch import during ``fit`` (torch._dynamo and sympy through
  ``fully_shard``, torch.distributed.fsdp and .tensor, ...), in use to the end. A script that
  imported them before the Trainer (transformers' model code brings many) sees less growth for
  the same process: the tiny Llama of benchmarks/gpu_check.py, its model code imported first,
  grew 46 MiB beyond its tensors. The model is then an upper bound.

The gathered units and gloo's staging copies are tensors, counted by the simulation; glibc maps
each afresh and returns it under fullshard's fixed ``cpu_mmap_threshold`` ([Note: CPU memory
under FSDP]); with ``cpu_mmap_threshold=None`` they stay in the heap and this model does not hold.

CUDA (not measured yet: benchmarks/gpu_check.py's ``llama-fsdp2`` part reads the context, what
lies outside the caching allocator and the allocator's reserve on the next GPU it runs on; until
then the values below are conservative ones from common experience, not measurements): the CUDA
context with torch's kernels loaded lazily is 0.3-0.6 GiB a process; an NCCL communicator keeps
buffers for each of its channels (``NCCL_BUFFSIZE``, 4 MiB, per protocol and peer), a few hundred
MiB; the caching allocator reserves more than the tensors it holds (blocks split and cached),
commonly 5-10% of a training step's peak.
"""

from __future__ import annotations

MIB = 2**20

# CPU (the figures in the note):
#: beyond tensors, whatever the model: the modules imported during ``fit`` and their objects,
#: autograd's and the optimizer's bookkeeping, the Trainer's state. The largest fitted run
#: (FSDP2, 93 MiB) rounded up, not the fit's 90.6 MiB: FSDP1 holds 5 MiB less, and the plan errs
#: on the side that keeps a run from failing
CPU_BASE = 94 * MIB
#: each process beyond the first: gloo's pair with it (the fit's 0.1 MiB, rounded up)
CPU_PER_PEER = 128 * 1024

# CUDA, not measured (see the note): conservative values until benchmarks/gpu_check.py reads them
#: the CUDA context of a process, torch's kernels loaded lazily (0.3-0.6 GiB seen commonly): high
CUDA_CONTEXT = 1024 * MIB
#: NCCL's buffers of the process's communicators, where there is more than one process
CUDA_NCCL = 512 * MIB
#: the caching allocator's reserved-but-unused bytes, as a fraction of the tensor peak
CUDA_RESERVE_FRACTION = 0.10


def cpu_process_overhead(world_size: int) -> int:
    """Bytes a CPU process (gloo) adds during ``fit`` beyond its tensors, in a job of
    ``world_size`` processes ([Note: memory that is not tensors])."""
    return CPU_BASE + CPU_PER_PEER * (world_size - 1)


def cuda_process_overhead(world_size: int, tensor_peak: int) -> int:
    """Device bytes a CUDA process holds beyond its tensors: the context, NCCL's buffers (more
    than one process) and the caching allocator's reserve over ``tensor_peak``. Not measured yet:
    conservative ([Note: memory that is not tensors])."""
    nccl = CUDA_NCCL if world_size > 1 else 0
    return int(CUDA_CONTEXT + nccl + CUDA_RESERVE_FRACTION * tensor_peak)


def process_overhead(device_type: str, *, world_size: int, tensor_peak: int) -> int:
    """Bytes beyond the tensors of one process of a ``device_type`` (``"cpu"`` or ``"cuda"``)
    job of ``world_size`` processes whose tensors peak at ``tensor_peak`` bytes."""
    if device_type == "cpu":
        return cpu_process_overhead(world_size)
    return cuda_process_overhead(world_size, tensor_peak)
