"""Steps on ``DTensor`` parameters that the FSDP2 and model-parallel strategies share: gradient
clipping over every mesh, gradient accumulation without a reduction, and parameter sizes.

[Note: a norm over several meshes]
Under 2D parallelism a model's parameters can live on different meshes: a tensor-parallel layer
sharded by FSDP2 on the ``("data_parallel", "tensor_parallel")`` mesh, a layer sharded by FSDP2
alone on its ``"data_parallel"`` sub-mesh, a tensor-parallel layer without FSDP on the
``"tensor_parallel"`` one. torch's ``clip_grad_norm_`` stacks the per-parameter norms, which
fails across meshes; so the gradients are grouped by mesh, each group's norm is taken by torch
(a DTensor reduced over its mesh, gathered once per group), and the groups' norms are combined.
Every process ends with the norm of the whole model's gradient, as one process would compute it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from fullshard.strategies.parameter_sizes import ParameterSize, clean_parameter_name


def total_grad_norm(parameters: Iterable[torch.Tensor], norm_type: float = 2.0) -> torch.Tensor:
    """The ``norm_type``-norm of all gradients of ``parameters`` together, as a plain tensor on
    every process (see [Note: a norm over several meshes]). Collective over the meshes involved."""
    from torch.distributed.tensor import DTensor

    groups: dict[object, list[torch.Tensor]] = {}
    for p in parameters:
        if p.grad is not None:
            key = p.grad.device_mesh if isinstance(p.grad, DTensor) else None
            groups.setdefault(key, []).append(p.grad)
    if not groups:
        return torch.tensor(0.0)
    norms = []
    for grads in groups.values():
        norm = torch.nn.utils.get_total_norm(grads, norm_type)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    device = norms[0].device
    total: torch.Tensor = torch.linalg.vector_norm(torch.stack([n.to(device) for n in norms]), norm_type)
    return total


@torch.no_grad()
def clip_grad_norm_over_meshes(
    parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
) -> torch.Tensor:
    """Scale the gradients of ``parameters`` so that their total norm is at most ``max_norm``;
    returns the total norm before clipping (see [Note: a norm over several meshes])."""
    from torch.distributed.tensor import DTensor

    params = [p for p in parameters if p.grad is not None]
    total = total_grad_norm(params, norm_type)
    coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for p in params:
        grad = p.grad
        assert grad is not None  # filtered above
        local = grad.to_local() if isinstance(grad, DTensor) else grad
        local.mul_(coefficient.to(local.device, local.dtype))
    return total


@contextlib.contextmanager
def no_gradient_sync(model: nn.Module) -> Iterator[None]:
    """Accumulate gradients locally (no reduce-scatter) in an FSDP2 module inside the context."""
    model.set_requires_gradient_sync(False)  # type: ignore[operator]
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)  # type: ignore[operator]


def dtensor_parameter_sizes(module: nn.Module) -> list[ParameterSize]:
    """Each parameter's full size and this process's share: a DTensor's shape is the full one,
    its local tensor this process's part."""
    from torch.distributed.tensor import DTensor

    return [
        ParameterSize(
            clean_parameter_name(name),
            p.numel(),
            p.to_local().numel() if isinstance(p, DTensor) else p.numel(),
            p.requires_grad,
            p.element_size(),
        )
        for name, p in module.named_parameters()
    ]
