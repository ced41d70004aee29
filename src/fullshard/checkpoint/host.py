"""What the checkpoint engine needs from whoever holds the model: :class:`CheckpointHost`.

Every strategy is one (``fullshard.strategies.Strategy``), but checkpoint/ names none of them:
the engine (:mod:`fullshard.checkpoint.engine`) and its owner
(:class:`~fullshard.checkpoint.checkpointer.Checkpointer`) see a host through these members
only, so a strategy saves and loads without a Trainer, and a test can drive the engine with a
host of its own. How a checkpoint is written (full or sharded, in the background or not) is not
the host's to say here: the caller passes it with each save.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

import torch
from torch import nn
from torch.optim import Optimizer

T = TypeVar("T")


class CheckpointHost(Protocol):
    """The model's and optimizers' states, their full shapes, and the collectives the engine
    takes its decisions with. With one process the collectives communicate nothing."""

    @property
    def global_rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def module(self) -> nn.Module | None:
        """The user's module, unwrapped: its parameter and buffer names (ties, what a step changes)."""
        ...

    def broadcast(self, obj: T, src: int = 0) -> T: ...

    def all_gather_object(self, obj: T) -> list[T]: ...

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool: ...

    def get_state(
        self, optimizers: Sequence[Optimizer], *, full: bool, to_load: bool = False, to_save: bool = False
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Model and optimizer states keyed by the module's own names: whole tensors (``full``)
        or this rank's shards; ``to_load``: a template a sharded load reads into; ``to_save``:
        for a checkpoint (a full state may then be on rank 0 only)."""
        ...

    def set_state(
        self,
        model_state: dict[str, Any],
        optimizer_states: Sequence[dict[str, Any]],
        optimizers: Sequence[Optimizer],
        *,
        full: bool,
        from_rank0: bool,
        strict: bool = True,
    ) -> None:
        """Load states of :meth:`get_state`'s form (``from_rank0``: only rank 0's are given)."""
        ...

    def set_optimizer_states(
        self,
        optimizer_states: Sequence[dict[str, Any]],
        optimizers: Sequence[Optimizer],
        *,
        full: bool,
        from_rank0: bool,
    ) -> None:
        """The optimizers' part of :meth:`set_state` alone (the model's state is in place)."""
        ...

    def full_shapes(self) -> dict[str, torch.Size]:
        """The full (unsharded) shapes of the model's state, to check checkpoints against.
        Collective under FSDP with manual wrapping."""
        ...
