"""The parameters of a model as its user wrote them: full size, this process's share, and names
without the prefixes wrappers (FSDP1, activation checkpointing) insert. The wrap plan, the model
summary and the memory estimate read them (:meth:`Strategy.parameter_sizes`)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

_WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


@dataclass(frozen=True)
class ParameterSize:
    """One parameter of the model as the user wrote it: its full size and this process's share.

    ``name`` carries no wrapper prefixes; ``numel`` is the whole parameter's element count,
    ``local_numel`` the part this process holds (smaller only when a strategy shards it).
    """

    name: str
    numel: int
    local_numel: int
    requires_grad: bool
    element_size: int


def clean_parameter_name(name: str) -> str:
    """``name`` without the prefixes FSDP1 and activation checkpointing wrappers insert."""
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def unsharded_parameter_sizes(module: nn.Module) -> list[ParameterSize]:
    """Each parameter of ``module`` as it is: whole, and all of it held by this process."""
    return [
        ParameterSize(clean_parameter_name(name), p.numel(), p.numel(), p.requires_grad, p.element_size())
        for name, p in module.named_parameters()
    ]
