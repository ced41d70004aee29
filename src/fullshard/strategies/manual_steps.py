"""FSDP (FSDP1 and FSDP2) under manual optimization: what a training step that runs backward,
clips and steps inside the root unit's forward needs.

[Note: FSDP under manual optimization]
The training step runs inside the root unit's forward (see [Note: forward redirection] in
forward_redirection.py), and under manual optimization the module calls backward (and steps) there. A
unit's backward inside its own forward is refused (FSDP1) or leaves gradients unreduced (FSDP2),
so the root unit must hold no parameter itself: every parameter must belong to a nested unit
(``auto_wrap_policy``, e.g. the generator's and the discriminator's classes). FSDP1 also needs,
inside that forward, its end-of-backward work run by hand (:func:`finish_backward`) and the
gradient norm computed without ``clip_grad_norm_`` (:func:`clip_sharded_gradients`); its
``no_sync()`` cannot start there, so under manual optimization FSDP1 synchronises every backward
(FSDP2 and DDP can accumulate locally).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from fullshard.errors import MisconfigurationError
from fullshard.strategies.parameter_sizes import clean_parameter_name


def no_sync_in_step_error() -> MisconfigurationError:
    """The error of ``FSDPStrategy.no_backward_sync`` inside a training step."""
    return MisconfigurationError(
        "FSDPStrategy cannot skip the gradient synchronisation inside a training step (manual optimization): "
        "FSDP1's no_sync() refuses to start inside the root unit's forward. Let every manual_backward "
        "synchronise (no no_backward_sync / toggle_model(sync_grad=False)), or use FSDP2Strategy or DDP, "
        "which accumulate locally there."
    )


def root_held_parameters(model: nn.Module, unit_type: type) -> list[str]:
    """Names of the parameters of ``model`` (the root unit) that no nested FSDP unit holds."""
    nested = {
        id(p) for m in model.modules() if isinstance(m, unit_type) and m is not model for p in m.parameters()
    }
    return [clean_parameter_name(name) for name, p in model.named_parameters() if id(p) not in nested]


def check_root_holds_nothing(model: nn.Module, unit_type: type, owner: str) -> None:
    """Raise when the root unit ``model`` holds parameters itself (manual optimization).

    Raises:
        MisconfigurationError: naming the parameters and the fix.
    """
    held = root_held_parameters(model, unit_type)
    if held:
        shown = ", ".join(held[:4]) + (f" and {len(held) - 4} more" if len(held) > 4 else "")
        raise MisconfigurationError(
            f"{owner} under manual optimization (automatic_optimization = False) needs every parameter in a "
            f"nested FSDP unit, but the root unit holds {shown}: backward runs inside the training step, which "
            "is the root unit's forward. Pass an auto_wrap_policy that wraps the submodules holding them (e.g. "
            "auto_wrap_policy={Generator, Discriminator}), or use strategy='ddp'."
        )


def clip_sharded_gradients(
    optimizer: Optimizer, max_norm: float, norm_type: float, group: Any
) -> torch.Tensor:
    """Clip the gradient shards of ``optimizer``'s parameters by the norm of the whole gradient:
    the shards' norms are combined over ``group`` (None: the gradients are whole on each rank)."""
    import torch.distributed as dist

    grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    device = grads[0].device if grads else torch.device("cpu")
    if norm_type == float("inf"):
        maxima = [g.detach().abs().max().float() for g in grads if g.numel()]
        total = torch.stack(maxima).max() if maxima else torch.zeros((), device=device)
        if group is not None:
            dist.all_reduce(total, op=dist.ReduceOp.MAX, group=group)
    else:
        powers = [g.detach().float().norm(norm_type) ** norm_type for g in grads if g.numel()]
        total = torch.stack(powers).sum() if powers else torch.zeros((), device=device)
        if group is not None:
            dist.all_reduce(total, group=group)
        total = total ** (1.0 / norm_type)
    coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for grad in grads:
        grad.detach().mul_(coefficient.to(grad.dtype))
    return total


def finish_backward(root: nn.Module) -> None:
    """Finish an FSDP1 backward run inside the root unit's forward (manual optimization).

    FSDP1 queues the end-of-backward work (resharding, finalising gradients, the units' states
    back to idle) from the root's pre-backward hook, which is only on the root's forward outputs,
    and so never queued for a backward inside that forward: the units would stay in their
    post-backward state and refuse the next state-dict call. There is no public API for it: the
    private callback is called here, in this one place. See [Note: FSDP under manual optimization].
    """
    from torch.distributed.fsdp._runtime_utils import _post_backward_final_callback

    _post_backward_final_callback(root, root)  # type: ignore[arg-type]


def inside_forward(model: nn.Module) -> bool:
    """Whether the FSDP1 root ``model`` is running (the training step, under manual optimization)."""
    return getattr(getattr(model, "training_state", None), "name", "IDLE") != "IDLE"
