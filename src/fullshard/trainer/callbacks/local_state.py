"""The tensors a process holds of a model, as plain tensors: for averaging weights and for
putting a model back after a search, without ever gathering a sharded model.

[Note: averaging the local shards]
Weight averaging (``WeightAveraging``, ``StochasticWeightAveraging``) and the tuner's snapshot
work element by element, so each process can do them on the part of each parameter it holds:
under DDP the whole tensor, under FSDP2 the local shard of each ``DTensor``, under FSDP1 the
view of the flat shard that ``use_orig_params=True`` gives each parameter (an empty tensor on a
process that holds none of it; with ``use_orig_params=False`` the flat parameter itself). The
copies therefore take as much memory per process as the parameters do, never a whole model.

[Note: FSDP1 keeps the root's gathered parameters]
After a forward without a backward (a validation), torch's FSDP1 keeps the root unit's gathered
(unsharded) parameters, and the next forward uses them without gathering again. Weights written
into the shards in between (the average swapped in or out, a search's weights put back) would be
ignored by that forward: training would go on from the values gathered before the write.
:func:`drop_gathered_copies` frees such a kept copy, so that the next forward gathers what the
shards hold. It uses FSDP1's flat-parameter handle (``_handle``), as no public API frees the copy;
this is the one place that does.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import torch
from torch import nn


def local_part(tensor: torch.Tensor) -> torch.Tensor:
    """The part of ``tensor`` this process holds (a ``DTensor``'s local shard), aliasing it."""
    tensor = tensor.detach()
    # torch.distributed.tensor costs 0.4 s to import: a process that has not imported it has no
    # DTensor, so ``import fullshard`` does not pay for it here.
    dtensor = sys.modules.get("torch.distributed.tensor")
    return tensor.to_local() if dtensor is not None and isinstance(tensor, dtensor.DTensor) else tensor


def local_tensors(module: nn.Module, *, buffers: bool = True) -> list[torch.Tensor]:
    """The process's own storage of ``module``'s parameters (then buffers): tensors that alias
    it, so that writing them writes the model. See [Note: averaging the local shards]."""
    found: Iterator[torch.Tensor] = iter(module.parameters())
    tensors = [local_part(p) for p in found]
    if buffers:
        tensors += [local_part(b) for b in module.buffers()]
    return tensors


def clone_to(tensors: list[torch.Tensor], device: torch.device | None) -> list[torch.Tensor]:
    """Detached copies of ``tensors`` (on ``device`` when given)."""
    return [t.detach().clone() if device is None else t.detach().to(device, copy=True) for t in tensors]


def drop_gathered_copies(model: nn.Module | None) -> None:
    """Free the gathered parameters FSDP1 kept after a forward, so that the next forward
    gathers the shards afresh (see [Note: FSDP1 keeps the root's gathered parameters]). Nothing
    to do for other models."""
    if model is None:
        return
    from torch.distributed.fsdp import FullyShardedDataParallel

    for unit in model.modules():
        handle = getattr(unit, "_handle", None) if isinstance(unit, FullyShardedDataParallel) else None
        if handle is not None and handle.uses_sharded_strategy and not handle.needs_unshard():
            handle.reshard(True)
            handle.post_reshard()


@torch.no_grad()
def copy_into(
    targets: list[torch.Tensor], sources: list[torch.Tensor], root: nn.Module | None = None
) -> None:
    """Write ``sources`` into ``targets`` element by element (devices may differ). ``root``: the
    model ``targets`` belong to, as the strategy runs it, when they are its weights."""
    for target, source in zip(targets, sources, strict=True):
        target.copy_(source.to(target.device))
    drop_gathered_copies(root)


@torch.no_grad()
def swap(first: list[torch.Tensor], second: list[torch.Tensor], root: nn.Module | None = None) -> None:
    """Exchange the values of two lists of tensors of the same shapes (``root``: as for
    :func:`copy_into`)."""
    for a, b in zip(first, second, strict=True):
        held = a.clone()
        a.copy_(b.to(a.device))
        b.copy_(held.to(b.device))
    drop_gathered_copies(root)
