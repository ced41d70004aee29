"""Gradients a model still holds (from an earlier ``fit``, or a hook's backward pass) cleared
before a checkpoint's optimizer states load.

[Note: gradients cleared before optimizer states load]
torch's distributed state-dict API (``get_optimizer_state_dict``/``set_optimizer_state_dict``)
gives an optimizer that has not stepped yet its initial state by one step with zero gradients,
and skips that step when any of its parameters already has a gradient (it takes that for a
stateless optimizer). A model that an earlier Trainer fit keeps the gradients of its last step,
so a second Trainer's ``fit(model, ckpt_path=...)`` met a fresh optimizer with no state: a full
checkpoint failed in torch ("Expected device to be set") and a sharded one read no optimizer
state at all, resuming with Adam's moments at zero. Lightning loads with
``Optimizer.load_state_dict``, which does not look at gradients, and clears the gradients
(``zero_grad``) right after the load, before its loops run; clearing them before the load
instead leaves the model as Lightning's when training starts.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch.optim import Optimizer


def clear_gradients(optimizers: Sequence[Optimizer]) -> None:
    """Set the gradient of every parameter of ``optimizers`` to None (see [Note: gradients
    cleared before optimizer states load])."""
    for optimizer in optimizers:  # not optimizer.zero_grad(): a subclass may do more there
        for group in optimizer.param_groups:
            for param in group["params"]:
                param.grad = None
