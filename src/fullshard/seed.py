"""Seeding and the random-number-generator states a checkpoint stores per rank."""

from __future__ import annotations

import random
from typing import Any

import torch
from lightning_utilities.core.imports import RequirementCache

_NUMPY = RequirementCache("numpy")
_seed: int | None = None


def seed_everything(seed: int) -> int:
    """Seed Python's ``random``, NumPy (when installed) and torch (CPU and CUDA) with ``seed``.

    The seed also orders the shuffling of the samplers the Trainer builds, so every process of a
    job must call this with the same value (the Trainer's processes run the same script, so they
    do). Returns ``seed``.
    """
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {type(seed).__name__} ({seed!r}).")
    global _seed
    _seed = seed
    random.seed(seed)
    if _NUMPY:
        import numpy as np

        np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return seed


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
