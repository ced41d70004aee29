"""The ``StateDictOptions`` a strategy asks torch's distributed state-dict API for
(:meth:`Strategy.get_state`, :meth:`Strategy.set_state`).

[Note: full saves gathered off the GPU]
A full checkpoint needs the whole model and optimizer state in one process. Gathered where the
parameters live (``cpu_offload=False``), every rank of a sharded model (FSDP, tensor
parallelism) holds a whole copy in GPU memory while it saves: a model sharded to fit would not
fit then. So a full state of a sharded model taken to be saved on CUDA asks for
``cpu_offload=True``: torch then gathers each tensor and keeps it on rank 0 only, in host memory
(FSDP1's ``FullStateDictConfig(offload_to_cpu=True, rank0_only=True)``; FSDP2's and tensor
parallelism's DTensors gathered one by one into a host copy on rank 0), and the other ranks get
empty states. Rank 0 is the one that writes a full checkpoint (checkpoint/engine.py); the save
hooks of the other ranks see an empty ``"state_dict"``, as under Lightning's FSDP strategies.
Full states taken for any other use keep ``cpu_offload=False``: they are wanted on every rank
(a template to load into, a load, :meth:`Strategy.module_state_dict`, a tuner's snapshot of the
Trainer, which it loads back on every rank, and so ``WeightAveraging``'s average, which its save
hook puts into that snapshot too). Unsharded models (one device, DDP) gather nothing and keep
their states on the device, as Lightning's do. On the CPU nothing changes: the state is in host
memory already, and FSDP1's full state dict with ``cpu_offload=True`` ended the process with
SIGSEGV on CPU with gloo in our probe (docs/design.md, "State dicts and checkpoints").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed.checkpoint.state_dict import StateDictOptions


def state_dict_options(
    *, full: bool, device_type: str, sharded: bool, to_save: bool = False
) -> StateDictOptions:
    """The options for the state of a model on ``device_type`` (``torch.device.type``) whose
    parameters are ``sharded`` or not: whole tensors with ``full``, gathered to rank 0's host
    memory when ``to_save`` a sharded model's on CUDA ([Note: full saves gathered off the GPU])."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    offload = full and to_save and sharded and device_type == "cuda"
    return StateDictOptions(full_state_dict=full, cpu_offload=offload)
