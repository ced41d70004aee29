"""Plain-PyTorch references for the porting scripts: the batches each rank reads, and training
loops in one process that the distributed runs must match."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn


def rank_indices(n: int, world_size: int, rank: int, *, shuffle: bool, seed: int, epoch: int) -> list[int]:
    """The sample indices ``torch.utils.data.DistributedSampler`` gives ``rank`` in ``epoch``
    (the sampler both Lightning and fullshard put in front of a map-style dataset)."""
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        order = torch.randperm(n, generator=g).tolist()
    else:
        order = list(range(n))
    total = math.ceil(n / world_size) * world_size
    order += order[: total - n]
    return order[rank:total:world_size]


def global_batches(
    n: int,
    batch_size: int,
    world_size: int,
    *,
    shuffle: bool,
    seed: int,
    epoch: int,
    limit: int | None = None,
) -> Iterator[list[int]]:
    """Per step, the union of the samples every rank reads (each rank reads ``batch_size``).

    With equal batch sizes, averaging the gradients of the ranks' mean losses (DDP, FSDP) equals
    the gradient of the mean loss over this union in one process.
    """
    per_rank = [
        rank_indices(n, world_size, r, shuffle=shuffle, seed=seed, epoch=epoch) for r in range(world_size)
    ]
    steps = math.ceil(len(per_rank[0]) / batch_size)
    if limit is not None:
        steps = min(steps, limit)
    for i in range(steps):
        yield [idx for r in range(world_size) for idx in per_rank[r][i * batch_size : (i + 1) * batch_size]]


def mean_loss(
    model: nn.Module, loss_fn: Callable[..., torch.Tensor], data: Sequence[torch.Tensor], indices: Any = None
) -> float:
    """``loss_fn(model(x), y)`` over the whole of ``data`` (or ``indices`` of it), in one process."""
    x, y = data[0], data[1]
    if indices is not None:
        x, y = x[indices], y[indices]
    with torch.no_grad():
        return float(loss_fn(model(x), y))


def state_close(
    a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], tol: float = 1e-5
) -> tuple[bool, str]:
    """Whether two state dicts hold the same keys and values within ``tol``; and the worst key."""
    if set(a) != set(b):
        return False, f"keys differ: {sorted(set(a) ^ set(b))}"
    worst, where = 0.0, ""
    for key in a:
        diff = float((a[key].double() - b[key].double()).abs().max()) if a[key].numel() else 0.0
        if diff > worst:
            worst, where = diff, key
    return worst <= tol, f"max abs difference {worst:.3g} at {where or '-'}"
