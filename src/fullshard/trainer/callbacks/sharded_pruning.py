"""L1 pruning of sharded parameters (FSDP, FSDP2), for ``ModelPruning``.

[Note: pruning sharded parameters]
``torch.nn.utils.prune`` cannot act on FSDP's parameters: it replaces a parameter by
``weight_orig`` times a mask in a forward pre-hook, while FSDP replaces the parameters itself
around each forward. Under FSDP and FSDP2, ``ModelPruning`` therefore keeps one mask per pruned
parameter, shaped like the part of it this process holds, and multiplies that part by it after
each optimizer step and whenever it prunes. For optimizers that update each element from its own
gradient (SGD, Adam, ...) the kept weights follow the same path as under ``torch.nn.utils.prune``,
whose masked forward gives pruned weights no gradient: a pruned weight is zero in every forward.

The L1 threshold, the magnitude of the ``k``-th smallest weight still unpruned, is found by
bisection over the values, each step one all-reduce of a count: no process gathers the
parameters. Weights equal to the threshold are all pruned (``torch.topk`` would choose among
equal values), which makes a difference only for exact ties.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

from fullshard.trainer.callbacks.local_state import local_part

if TYPE_CHECKING:
    from fullshard.trainer.trainer import Trainer

_BISECTION_STEPS = 48


class ShardedMasks:
    """Masks of this process's part of each pruned parameter, and their pruning."""

    def __init__(self, trainer: Trainer, parameters: Sequence[tuple[nn.Module, str]]) -> None:
        self.trainer = trainer
        self.parameters = list(parameters)
        self.masks = [torch.ones_like(self._local(i), dtype=torch.bool) for i in range(len(self.parameters))]
        self.originals = [self._local(i).clone() for i in range(len(self.parameters))]
        self._reset_done = False
        self.forward_weights: list[torch.Tensor] = []
        self.pruned = False

    def _local(self, index: int) -> torch.Tensor:
        module, name = self.parameters[index]
        return local_part(getattr(module, name))

    def _sum(self, value: float) -> float:
        strategy = self.trainer.strategy
        return float(
            strategy.all_reduce(torch.tensor(value, dtype=torch.float64, device=strategy.root_device), "sum")
        )

    def _max(self, value: float) -> float:
        strategy = self.trainer.strategy
        return float(
            strategy.all_reduce(torch.tensor(value, dtype=torch.float64, device=strategy.root_device), "max")
        )

    def mask_gradients(self) -> None:
        """Zero the gradients of the pruned weights before the step is clipped and taken, as
        ``torch.nn.utils.prune``'s masked forward gives them none (gradient clipping by norm then
        sees the same gradients)."""
        if not self.pruned:
            return
        for i, (module, name) in enumerate(self.parameters):
            grad = getattr(module, name).grad
            if grad is not None:
                local_part(grad).mul_(self.masks[i])

    def remember_forward_weights(self) -> None:
        """Keep the weights the coming optimizer step changes: a pruning at the end of this
        epoch ranks them, as ``torch.nn.utils.prune`` ranks the masked weight its last forward
        computed (before the epoch's last step) once a parameter has been pruned; before the
        first pruning it ranks the parameter itself, as it is."""
        if self.pruned:
            self.forward_weights = [self._local(i).detach().clone() for i in range(len(self.parameters))]

    def _scores(self, index: int) -> torch.Tensor:
        weights = self.forward_weights[index] if self.forward_weights else self._local(index).detach()
        return weights.abs() * self.masks[index]  # pruned ones count as zero, as the masked weight is

    def _threshold(self, indices: Sequence[int], amount: int | float) -> float | None:
        """The magnitude at or below which the ``amount`` smallest unpruned weights of the
        parameters ``indices`` lie (None: nothing to prune). Collective."""
        values = [self._scores(i)[self.masks[i]].double() for i in indices]
        unpruned = self._sum(float(sum(v.numel() for v in values)))
        k = round(amount * unpruned) if isinstance(amount, float) else int(amount)
        if k <= 0:
            return None
        if k >= unpruned:
            return math.inf
        low, high = -1.0, self._max(max((float(v.max()) for v in values if v.numel()), default=0.0))
        for _ in range(_BISECTION_STEPS):  # the smallest t with count(|w| <= t) >= k
            middle = (low + high) / 2
            if self._sum(float(sum(int((v <= middle).sum()) for v in values))) >= k:
                high = middle
            else:
                low = middle
        return high

    @torch.no_grad()
    def prune(self, amount: int | float, together: bool) -> None:
        """Prune ``amount`` (a fraction of the unpruned weights, or a count) of the smallest
        magnitudes: over all the parameters ``together``, else of each parameter."""
        groups = (
            [list(range(len(self.parameters)))] if together else [[i] for i in range(len(self.parameters))]
        )
        for indices in groups:
            threshold = self._threshold(indices, amount)
            if threshold is None:
                continue
            for i in indices:
                self.masks[i] &= self._scores(i) > threshold
        self.forward_weights = []
        self.pruned = True
        self.apply()

    @torch.no_grad()
    def apply(self) -> None:
        """Zero the pruned weights (after each optimizer step, and after pruning)."""
        for i, mask in enumerate(self.masks):
            self._local(i).mul_(mask)
        self.trainer.strategy.local_weights_written()

    @torch.no_grad()
    def reset_to_originals(self) -> None:
        """The lottery ticket: the unpruned weights back to their values at the start.

        As in Lightning, only the first reset goes back to the start: Lightning's reset points
        each ``weight_orig`` at its copy of the initial values, which the optimizer then updates
        in place, so later resets find the weights as they are.
        """
        if self._reset_done:
            return
        for i, mask in enumerate(self.masks):
            self._local(i).copy_(self.originals[i] * mask)
        self._reset_done = True
        self.originals = []
        self.trainer.strategy.local_weights_written()

    def sparsity(self) -> tuple[int, int]:
        """(pruned, total) weights of all the pruned parameters, over every process."""
        pruned = self._sum(float(sum(int((~m).sum()) for m in self.masks)))
        total = self._sum(float(sum(m.numel() for m in self.masks)))
        return int(pruned), int(total)
