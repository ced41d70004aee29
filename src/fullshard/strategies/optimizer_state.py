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
    # Whether an optimizer stepped is asked of every rank: [Note: FSDP1 ranks without a trained
    # parameter].
    stepped = _stepped_on_any_rank(model, [bool(optimizer.state) for optimizer in optimizers])
    states = []
    for optimizer, has_stepped in zip(optimizers, stepped, strict=True):
        empty_here = not optimizer.state
        state = get_optimizer_state_dict(model, optimizer, options=options)
        if empty_here:  # this rank's optimizer stays as it was (torch filled it to build the state)
            optimizer.state.clear()
        if not has_stepped and not to_load:
            state = {**state, "state": {}}
        states.append(state)
    return states


def _stepped_on_any_rank(model: nn.Module, held: list[bool]) -> list[bool]:
    """For each optimizer, whether it holds per-parameter state on any rank (``held``: on this one).

    [Note: FSDP1 ranks without a trained parameter]
    Under FSDP1 (``use_orig_params=True``) each original parameter is a view into this rank's
    flat shard, empty where the shard holds none of it; such a parameter never gets a gradient
    here, so an optimizer whose parameters all lie outside this rank's shards has no state on it
    although it stepped on the others. The common case is LoRA: a unit holding a large frozen
    base and a small trained adapter, registered after the base, which lies in the last rank's
    shard only. torch's state dict builds this rank's part all the same (it gathers the state
    from the ranks that hold it and gives each rank its chunk; this rank's own ``step`` is not
    used), but the state must not be taken for an unstepped one here: the sharded save would
    lack this rank's chunks (DCP: "invalid fill tensor-volume") and rank 0's full save would hold
    no optimizer state at all. So under FSDP1 the ranks agree, by one small collective per call
    (every rank builds the state there: torch's state dict is collective). Elsewhere nothing is
    exchanged: DDP's ranks hold the same state, and FSDP2 keeps state for each DTensor parameter,
    an empty local shard included.
    """
    import torch.distributed as dist

    from fullshard.strategies.fsdp_options import torch_fsdp

    if not held or not dist.is_initialized() or dist.get_world_size() == 1:
        return held
    # (torch's state-dict module, used next, imports torch's FSDP anyway)
    fsdp_class = torch_fsdp().FullyShardedDataParallel
    if not any(isinstance(module, fsdp_class) for module in model.modules()):
        return held
    gathered: list[list[bool] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, held)
    return [any(rank[i] for rank in gathered if rank is not None) for i in range(len(held))]


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
