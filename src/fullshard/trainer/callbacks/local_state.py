"""The tensors a process holds of a model, as plain tensors: for averaging weights and for
putting a model back after a search, without ever gathering a sharded model.

[Note: averaging the local shards]
Weight averaging (``WeightAveraging``, ``StochasticWeightAveraging``) and the tuner's snapshot
work element by element, so each process can do them on the part of each parameter it holds:
under DDP the whole tensor, under FSDP2 the local shard of each ``DTensor``, under FSDP1 the
view of the flat shard that ``use_orig_params=True`` gives each parameter (an empty tensor on a
process that holds none of it; with ``use_orig_params=False`` the flat parameter itself). The
copies therefore take as much memory per process as the parameters do, never a whole model.

Writing them under FSDP1 needs one more step from the strategy (``Strategy.local_weights_written``:
[Note: FSDP1 keeps the root's gathered parameters] in fullshard/strategies/flat_params.py).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from fullshard.strategies import Strategy


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


@torch.no_grad()
def copy_into(
    targets: list[torch.Tensor], sources: list[torch.Tensor], strategy: Strategy | None = None
) -> None:
    """Write ``sources`` into ``targets`` element by element (devices may differ). ``strategy``:
    the one running the model, when ``targets`` are its weights (it is told they were written)."""
    for target, source in zip(targets, sources, strict=True):
        target.copy_(source.to(target.device))
    if strategy is not None:
        strategy.local_weights_written()


@torch.no_grad()
def swap(first: list[torch.Tensor], second: list[torch.Tensor], strategy: Strategy | None = None) -> None:
    """Exchange the values of two lists of tensors of the same shapes (``strategy``: as for
    :func:`copy_into`)."""
    for a, b in zip(first, second, strict=True):
        held = a.clone()
        a.copy_(b.to(a.device))
        b.copy_(held.to(b.device))
    if strategy is not None:
        strategy.local_weights_written()
