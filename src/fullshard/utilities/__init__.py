"""The helpers a Lightning script imports from ``lightning.pytorch.utilities``, under the same names:
``from lightning.pytorch.utilities import rank_zero_only`` ports as
``from fullshard.utilities import rank_zero_only``.

What fullshard does not have there is listed with the reason in docs/lightning.md
("Lightning's public surface").
"""

from __future__ import annotations

import os
import pickle
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from fullshard.batch_transfer import move_data_to_device
from fullshard.lightning_aliases import lightning_names
from fullshard.module import AttributeDict
from fullshard.rank_zero import rank_zero_info, rank_zero_only, rank_zero_warn
from fullshard.trainer.callbacks.throughput import measure_flops
from fullshard.trainer.combined_loader import CombinedLoader
from fullshard.trainer.states import LightningEnum

if TYPE_CHECKING:
    from fullshard.strategies import Strategy

__all__ = [
    "AttributeDict",
    "CombinedLoader",
    "GradClipAlgorithmType",
    "LightningEnum",
    "disable_possible_user_warnings",
    "grad_norm",
    "is_picklable",
    "is_shared_filesystem",
    "measure_flops",
    "move_data_to_device",
    "rank_zero_deprecation",
    "rank_zero_info",
    "rank_zero_only",
    "rank_zero_warn",
    "suggested_max_num_workers",
]


class GradClipAlgorithmType(LightningEnum):
    """``Trainer(gradient_clip_algorithm=)``'s values."""

    VALUE = "value"
    NORM = "norm"


def rank_zero_deprecation(message: str, stacklevel: int = 4, **kwargs: Any) -> None:
    """A ``DeprecationWarning`` from global rank 0 only."""
    rank_zero_warn(message, stacklevel=stacklevel, category=DeprecationWarning, **kwargs)


def grad_norm(
    module: nn.Module, norm_type: float | int | str, group_separator: str = "/"
) -> dict[str, torch.Tensor]:
    """The ``norm_type`` norm of each parameter's gradient, and of all of them together, as a dict
    to log (``self.log_dict(grad_norm(self, 2))`` in ``on_before_optimizer_step``): keys
    ``grad_{norm}_norm{sep}{name}`` and ``grad_{norm}_norm_total``, as Lightning names them.

    Under FSDP each process holds shards of the gradients, so these are the norms of its shards.
    """
    norm = float(norm_type)
    if norm <= 0:
        raise ValueError(f"grad_norm(norm_type={norm_type!r}): the norm must be a positive number or 'inf'.")
    norms = {
        f"grad_{norm}_norm{group_separator}{name}": p.grad.data.norm(norm)
        for name, p in module.named_parameters()
        if p.grad is not None
    }
    if norms:
        norms[f"grad_{norm}_norm_total"] = torch.stack(list(norms.values())).norm(norm)
    return norms


def is_picklable(obj: object) -> bool:
    """Whether ``pickle.dumps(obj)`` works."""
    try:
        pickle.dumps(obj)
    except (pickle.PicklingError, AttributeError, TypeError):
        return False
    return True


def suggested_max_num_workers(local_world_size: int) -> int:
    """DataLoader workers per process that leave one core per process for the main loop."""
    if local_world_size < 1:
        raise ValueError(f"suggested_max_num_workers(local_world_size={local_world_size}): pass 1 or more.")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // local_world_size - 1)


def disable_possible_user_warnings(module: str = "") -> None:
    """Silence fullshard's advisory warnings (``UserWarning``s raised from ``module``, or from
    fullshard when it is empty)."""
    warnings.filterwarnings("ignore", category=UserWarning, module=module or "fullshard")


def is_shared_filesystem(strategy: Strategy, path: str | Path | None = None, timeout: float = 3.0) -> bool:
    """Whether every process of ``strategy``'s job sees the same files at ``path`` (the current
    directory by default): global rank 0 writes a file, the others wait up to ``timeout`` seconds
    for it. Collective; True with one process."""
    if strategy.world_size == 1:
        return True
    probe = Path(path or os.getcwd()) / strategy.broadcast(f".fullshard_shared_fs_{os.getpid()}", src=0)
    if strategy.is_global_zero:
        probe.touch()
    strategy.barrier("is_shared_filesystem")
    deadline = time.monotonic() + timeout
    found = probe.exists()
    while not found and time.monotonic() < deadline:
        time.sleep(0.1)
        found = probe.exists()
    shared = strategy.reduce_boolean_decision(found, all=True)
    strategy.barrier("is_shared_filesystem")
    if strategy.is_global_zero:
        probe.unlink(missing_ok=True)
    return shared


if not TYPE_CHECKING:  # Lightning's names that live elsewhere: [Note: Lightning's module paths]
    __getattr__ = lightning_names(__name__)
