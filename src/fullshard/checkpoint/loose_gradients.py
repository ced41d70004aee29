"""Gradients a model still holds (from an earlier ``fit``) set aside while a checkpoint's optimizer
states load.

[Note: gradients set aside while optimizer states load]
torch's distributed state-dict API (``get_optimizer_state_dict``/``set_optimizer_state_dict``)
gives an optimizer that has not stepped yet its initial state by one step with zero gradients,
and skips that step when any of its parameters already has a gradient (it takes that for a
stateless optimizer). A model that an earlier Trainer fit keeps the gradients of its last step,
so a second Trainer's ``fit(model, ckpt_path=...)`` met a fresh optimizer with no state: a full
checkpoint failed in torch ("Expected device to be set") and a sharded one read no optimizer
state at all, resuming with Adam's moments at zero. Lightning loads with
``Optimizer.load_state_dict``, which does not look at gradients. So the gradients are taken off
the parameters for the load and put back after it: the load sees the model as a fresh one would
be, and the gradients are left as Lightning leaves them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from torch.optim import Optimizer


@contextmanager
def gradients_set_aside(optimizers: Sequence[Optimizer]) -> Iterator[None]:
    """Set the gradient of every parameter of ``optimizers`` to None inside, and put each back
    after (see [Note: gradients set aside while optimizer states load])."""
    held = [
        (param, param.grad)
        for optimizer in optimizers
        for group in optimizer.param_groups
        for param in group["params"]
        if param.grad is not None
    ]
    for param, _ in held:
        param.grad = None
    try:
        yield
    finally:
        for param, grad in held:
            param.grad = grad
