"""FSDP1's private state, read and used in this one place: the full parameter sizes of a wrapped
model without communication (for the model summary; see [Note: FSDP1 full sizes]), and freeing
the gathered parameters a unit keeps after a forward (see [Note: FSDP1 keeps the root's gathered
parameters])."""

from __future__ import annotations

from typing import Any

from torch import nn

from fullshard.strategies.parameter_sizes import ParameterSize, clean_parameter_name


def flat_parameter_sizes(
    root: nn.Module, module: nn.Module, fsdp_class: type[nn.Module]
) -> list[ParameterSize]:
    """Each parameter of ``module`` (the user's module inside ``root``, the FSDP-wrapped model)
    with its full size and this rank's share."""
    flats = {id(flat): flat for flat in _flat_parameters(root, fsdp_class)}
    full = {  # use_orig_params=True: each original parameter is a view into this rank's shard
        id(p): n
        for f in flats.values()
        if f._params is not None
        for p, n in zip(f._params, f._numels, strict=True)
    }
    sizes = []
    for name, p in module.named_parameters():
        flat = flats.get(id(p))
        if flat is None:  # an original parameter (use_orig_params=True) or one FSDP does not manage
            numel = full.get(id(p), p.numel())
            sizes.append(
                ParameterSize(clean_parameter_name(name), numel, p.numel(), p.requires_grad, p.element_size())
            )
            continue
        # use_orig_params=False: the flat parameter stands for the unit's parameters; list them
        prefix = clean_parameter_name(name).removesuffix("_flat_param")
        for fqn, numel, shard in zip(flat._fqns, flat._numels, flat._shard_param_infos, strict=True):
            sizes.append(
                ParameterSize(
                    prefix + clean_parameter_name(fqn),
                    numel,
                    shard.numel_in_shard or 0,
                    p.requires_grad,
                    p.element_size(),
                )
            )
    return sizes


def _flat_parameters(root: nn.Module, fsdp_class: type[nn.Module]) -> list[Any]:
    """The FlatParameters of the FSDP units in ``root``.

    [Note: FSDP1 full sizes]
    FSDP1 replaces a unit's parameters by one flat, sharded tensor; with ``use_orig_params`` the
    original parameters stay as views into this rank's shard (empty where the rank holds none of
    one). Their full sizes exist only in the FlatParameter's private metadata (``_params``,
    ``_numels``, ``_fqns``, ``_shard_param_infos``): the public way, ``summon_full_params``, is
    collective and holds the whole model on every rank. This is the one place that reads it.
    """
    flats = (getattr(m, "_flat_param", None) for m in root.modules() if isinstance(m, fsdp_class))
    return [flat for flat in flats if flat is not None]


def drop_gathered_copies(model: nn.Module, fsdp_class: type[nn.Module]) -> None:
    """Free the gathered parameters FSDP1's units (of ``fsdp_class``) in ``model`` kept after a
    forward, so that the next forward gathers what the shards hold.

    [Note: FSDP1 keeps the root's gathered parameters]
    After a forward without a backward (a validation), torch's FSDP1 keeps the root unit's gathered
    (unsharded) parameters, and the next forward uses them without gathering again. Weights written
    into the shards in between (the average swapped in or out, a search's weights put back) would be
    ignored by that forward: training would go on from the values gathered before the write.
    :func:`drop_gathered_copies` frees such a kept copy, so that the next forward gathers what the
    shards hold. It uses FSDP1's flat-parameter handle (``_handle``), as no public API frees the copy;
    this is the one place that does.
    """
    for unit in model.modules():
        handle = getattr(unit, "_handle", None) if isinstance(unit, fsdp_class) else None
        if handle is not None and handle.uses_sharded_strategy and not handle.needs_unshard():
            handle.reshard(True)
            handle.post_reshard()
