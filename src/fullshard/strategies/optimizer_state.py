"""Optimizer states through torch's distributed state-dict API, for :meth:`Strategy.get_state`
and :meth:`Strategy.set_state`: an optimizer that has not stepped yet is saved empty and loaded
back as its groups' settings only ([Note: unstepped optimizers])."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from torch import nn
from torch.optim import Optimizer

from fullshard.errors import MisconfigurationError

if TYPE_CHECKING:
    from torch.distributed.checkpoint.state_dict import StateDictOptions


def optimizer_states(
    model: nn.Module, optimizers: Sequence[Optimizer], options: StateDictOptions, *, to_load: bool
) -> list[dict[str, Any]]:
    """The state of each of ``optimizers``, keyed by ``model``'s own parameter names (see
    :meth:`Strategy.get_state` for ``to_load``)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    # [Note: unstepped optimizers]
    # torch fills an optimizer state that is still empty by a step with zero gradients: AdamW's
    # step count would then be one ahead both in a run that saves before its first step and in
    # a run resumed from that checkpoint. So the filled state is dropped from the optimizer
    # again, and saved empty, as plain SGD's is: a load restores the groups' settings only.
    states = []
    for optimizer in optimizers:
        unstepped = not optimizer.state
        state = get_optimizer_state_dict(model, optimizer, options=options)
        if unstepped:
            optimizer.state.clear()
            if not to_load:
                state = {**state, "state": {}}
        states.append(state)
    return states


def load_optimizer_states(
    model: nn.Module,
    states: Sequence[dict[str, Any]],
    optimizers: Sequence[Optimizer],
    options: StateDictOptions,
    broadcast: Callable[[list[Any]], list[Any]] | None,
) -> None:
    """Load ``states`` (from :func:`optimizer_states`) into ``optimizers``. ``broadcast``: set when
    only rank 0 passes data (``options.broadcast_from_rank0``), to send the other ranks which
    optimizers hold no per-parameter state."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    # An optimizer without per-parameter state (plain SGD, or one saved before its first step:
    # [Note: unstepped optimizers]): torch's loader needs a state tensor to find the device and
    # fails ("Expected device to be set"), and there is nothing but the groups' hyperparameters
    # to restore anyway. With from_rank0 only rank 0 knows which.
    groups_only = [None if state.get("state") else state.get("param_groups", []) for state in states]
    saved_groups = [state.get("param_groups", []) for state in states]
    if broadcast is not None and optimizers:
        groups_only, saved_groups = broadcast([groups_only, saved_groups])
    for optimizer, state, groups, saved in zip(optimizers, states, groups_only, saved_groups, strict=True):
        if groups is not None:
            load_param_group_settings(optimizer, {"param_groups": groups})
            continue
        # torch's loader takes only the settings the groups have now: a setting added during the
        # run (SWALR's "swa_lr", a scheduler's "initial_lr" set by a callback that rebuilds it
        # later) is added first, as torch's Optimizer.load_state_dict would restore it
        for group, saved_group in zip(optimizer.param_groups, saved, strict=False):
            for key, value in saved_group.items():
                group.setdefault(key, value)
        set_optimizer_state_dict(model, optimizer, state, options=options)


def load_param_group_settings(optimizer: Optimizer, state: dict[str, Any]) -> None:
    """Put the saved hyperparameters (lr, momentum, ...) of each parameter group back."""
    saved_groups = state.get("param_groups", [])
    if len(saved_groups) != len(optimizer.param_groups):
        raise MisconfigurationError(
            f"The checkpoint's optimizer has {len(saved_groups)} parameter group(s), this one "
            f"{len(optimizer.param_groups)}. Build the optimizer with the groups it was trained with."
        )
    for group, saved in zip(optimizer.param_groups, saved_groups, strict=True):
        group.update({k: v for k, v in saved.items() if k != "params"})
