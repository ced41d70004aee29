"""Seeding and the random-number-generator states a checkpoint stores per rank."""

from __future__ import annotations

import os
import random
from typing import Any

import torch
from lightning_utilities.core.imports import RequirementCache

_NUMPY = RequirementCache(module="numpy")  # checked at the first use (torch has imported numpy by then)
_seed: int | None = None


_SEED_VAR = "FULLSHARD_GLOBAL_SEED"
_WORKERS_VAR = "FULLSHARD_SEED_WORKERS"


def seed_everything(seed: int | None = None, workers: bool = False) -> int:
    """Seed Python's ``random``, NumPy (when installed) and torch (CPU and CUDA) with ``seed``.

    The seed also orders the shuffling of the samplers the Trainer builds, so every process of a
    job must use the same value: with ``seed=None`` a seed is drawn once and handed to the
    processes the Trainer starts (through the environment), as Lightning does.
    ``workers=True`` also seeds ``random`` and NumPy in each dataloader worker of the loaders the
    Trainer builds, differently per worker, rank and epoch (torch seeds its own RNG per worker
    already). Returns the seed.
    """
    if seed is None:
        inherited = os.environ.get(_SEED_VAR)
        seed = int(inherited) if inherited is not None else random.SystemRandom().randrange(2**31)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int or None, got {type(seed).__name__} ({seed!r}).")
    global _seed
    _seed = seed
    os.environ[_SEED_VAR] = str(seed)
    os.environ[_WORKERS_VAR] = "1" if workers else "0"
    random.seed(seed)
    if _NUMPY:
        import numpy as np

        np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return seed


def reset_seed() -> None:
    """Seed again with what :func:`seed_everything` was last given (its seed and ``workers``
    flag, read from the environment so that processes the Trainer started have it too); nothing
    when it was never called. The distributed strategies call it when a process joins the job, as
    Lightning's do, so that every rank starts the run from the same generator states whatever the
    script drew before (building the model, splitting a dataset)."""
    seed = os.environ.get(_SEED_VAR)
    if seed is None:
        return
    seed_everything(int(seed), workers=seed_workers_requested())


def seed_workers_requested() -> bool:
    """Whether :func:`seed_everything` was called with ``workers=True``."""
    return os.environ.get(_WORKERS_VAR) == "1"


def seed_worker(worker_id: int) -> None:
    """``worker_init_fn`` for ``seed_everything(workers=True)``: seed ``random`` and NumPy in a
    dataloader worker from torch's per-worker seed (which already differs per worker and epoch)."""
    worker_seed = torch.initial_seed() % 2**32
    random.seed(worker_seed)
    if _NUMPY:
        import numpy as np

        np.random.seed(worker_seed)


def current_seed() -> int:
    """The seed last given to :func:`seed_everything`, or 0."""
    return _seed if _seed is not None else 0


def rng_states() -> dict[str, Any]:
    """The states of every random-number generator this process uses."""
    states: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if _NUMPY:
        import numpy as np

        states["numpy"] = np.random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["torch.cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore what :func:`rng_states` returned."""
    torch.set_rng_state(states["torch"])
    random.setstate(states["python"])
    if "numpy" in states and _NUMPY:
        import numpy as np

        np.random.set_state(states["numpy"])
    if "torch.cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["torch.cuda"])
