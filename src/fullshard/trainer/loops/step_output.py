"""What the fit loop makes of a ``training_step`` result under automatic optimization: its loss,
what ``on_train_batch_end`` receives, and what a None result does.

[Note: a training step that returns None]
As in Lightning, a batch whose ``training_step`` returns None adds no gradient, and nothing else
changes: ``zero_grad`` still runs on the first batch of an accumulation window, and at the
window's end the optimizer step runs (``on_before_optimizer_step``, clipping, ``optimizer.step()``
on whatever gradients the window has, none if every batch returned None) and counts
(``global_step``, step-interval schedulers, ``max_steps``); ``on_train_batch_end`` gets ``{}``;
a warning says so once per process. Unlike Lightning, which refuses None with several processes,
every rank may return None at the same batch (the fit loop has the ranks agree on it); a grad
scaler is left alone when there is no gradient ([Note: a window with no gradients] in
fullshard.precision). But not at the last batch of a window after a batch with a loss
(``accumulate_grad_batches > 1``, several processes): the window's gradients are synchronised by
the backward of its last batch, and stepping without one would step each rank on its own
gradients (or on FSDP's unsynchronised, unsharded ones), so that is refused.
``on_nonfinite_loss="skip"`` is the step that is skipped and not counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from fullshard.errors import MisconfigurationError
from fullshard.module_optimization import extract_loss as extract_loss  # the planner takes the loss so too
from fullshard.rank_zero import rank_zero_warn_once

if TYPE_CHECKING:
    from fullshard.trainer.trainer import Trainer


def batch_outputs(output: Any, loss: torch.Tensor | None) -> Any:
    """What ``on_train_batch_end`` receives, as in Lightning: a dict with the (normalised,
    detached) ``"loss"`` and the other entries of a dict result; ``{}`` when ``training_step``
    returned None."""
    if loss is None:
        return {}
    outputs = {k: v for k, v in output.items() if k != "loss"} if isinstance(output, Mapping) else {}
    outputs["loss"] = loss.detach()
    return outputs


def warn_none_once() -> None:
    """The warning of a ``training_step`` that returned None, once per process (as Lightning's
    class-level warning cache gives it)."""
    rank_zero_warn_once(
        "training_step returned None: that batch adds no gradient, and the optimizer step of its "
        "accumulation window still runs and counts (global_step, schedulers), as in Lightning. If this "
        "was on purpose, ignore this warning (given once).",
        stacklevel=1,
    )


def refuse_unsynchronised_window(trainer: Trainer, batch_idx: int) -> None:
    """Raise when, with several processes, the last batch of an accumulation window returned None
    after a batch that had a backward pass ([Note: a training step that returns None]); every rank
    decides alike (they agreed on the None and ran the same backward passes).

    Raises:
        MisconfigurationError: that is the case.
    """
    strategy = trainer.strategy
    accumulate = trainer.accumulate_grad_batches
    if strategy.world_size == 1 or accumulate == 1:
        return
    if any(strategy.precision.has_new_gradients(o) for o in trainer.optimizers):
        raise MisconfigurationError(
            f"training_step returned None at batch {batch_idx}, the last of an accumulation window "
            f"(accumulate_grad_batches={accumulate}) whose earlier batches had a loss. With {strategy.world_size} "
            "processes the window's gradients are synchronised by the backward of its last batch, so its "
            "optimizer step cannot be taken without one. Return a zero loss that keeps the graph instead of "
            "None at that batch (e.g. `return loss * 0`), or return None for every batch of the window."
        )
