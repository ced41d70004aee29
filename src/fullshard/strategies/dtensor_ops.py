"""Steps on ``DTensor`` parameters that the FSDP2 and model-parallel strategies share: the step
methods run through FSDP2's hooks, gradient clipping over every mesh, gradient accumulation
without a reduction, and parameter sizes; :class:`DTensorSteps` gives both strategies these
three as one set of overrides.

[Note: a norm over several meshes]
Under 2D parallelism a model's parameters can live on different meshes: a tensor-parallel layer
sharded by FSDP2 on the ``("data_parallel", "tensor_parallel")`` mesh, a layer sharded by FSDP2
alone on its ``"data_parallel"`` sub-mesh, a tensor-parallel layer without FSDP on the
``"tensor_parallel"`` one. torch's ``clip_grad_norm_`` stacks the per-parameter norms, which
fails across meshes; so the gradients are grouped by mesh and placements, each group's norm is
taken by torch (a DTensor reduced over its mesh, gathered once per group), and the groups' norms
are combined. Every process ends with the norm of the whole model's gradient, as one process would
compute it. On one 2-D mesh, gradients split over both dimensions (a tensor-parallel weight) and
over one (a sequence-parallel norm's, replicated over the tensor-parallel dimension) give norms
partial over different dimensions: stacked together, DTensor would redistribute them one by one,
and say on every process, at the first step, that it ran sequential all-reduces. Grouped by
placements they stack as they are, and each group's norm is reduced one mesh dimension at a time
(:func:`_replicated`), one all-reduce each.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from fullshard.strategies.parameter_sizes import ParameterSize, clean_parameter_name

if TYPE_CHECKING:
    from torch.optim import Optimizer

    from fullshard.precision import Precision


@torch.no_grad()  # to_local() outside autograd: a tenth of the time
def total_grad_norm(parameters: Iterable[torch.Tensor], norm_type: float = 2.0) -> torch.Tensor:
    """The ``norm_type``-norm of all gradients of ``parameters`` together, as a plain tensor on
    every process (see [Note: a norm over several meshes]). Collective over the meshes involved."""
    from torch.distributed.tensor import DTensor

    groups: dict[object, list[torch.Tensor]] = {}
    for p in parameters:
        if p.grad is not None:
            key = (p.grad.device_mesh, p.grad.placements) if isinstance(p.grad, DTensor) else None
            groups.setdefault(key, []).append(p.grad)
    if not groups:
        return torch.tensor(0.0)
    norms = [
        _sharded_norm(grads, norm_type)
        if key is not None
        else torch.nn.utils.get_total_norm(grads, norm_type)
        for key, grads in groups.items()
    ]
    device = norms[0].device
    total: torch.Tensor = torch.linalg.vector_norm(torch.stack([n.to(device) for n in norms]), norm_type)
    return total


def _sharded_norm(grads: list[torch.Tensor], norm_type: float) -> torch.Tensor:
    """The norm of ``grads``, DTensors of one mesh and placements: each process takes the norm of
    its local parts, and these are combined over the mesh dimensions the gradients are split along
    (a replicated dimension holds copies), one all-reduce per dimension."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    assert all(isinstance(g, DTensor) for g in grads)
    first: DTensor = grads[0]  # type: ignore[assignment]
    if any(p.is_partial() for p in first.placements):  # not reduced yet: DTensor's own arithmetic
        return _replicated(torch.nn.utils.get_total_norm(grads, norm_type))
    # an empty local part (FSDP2 pads uneven shards) adds nothing; the inf-norm has no identity
    local = [t for t in (g.to_local() for g in grads) if t.numel() > 0]  # type: ignore[attr-defined]
    inf = norm_type == float("inf")
    # torch's norm of plain tensors (foreach kernels where the device has them), in float32 to add up
    value = (
        torch.nn.utils.get_total_norm(local, norm_type).float()
        if local
        else torch.zeros((), device=first.device)
    )
    if not inf:
        value = torch.pow(value, norm_type)
    if value.device.type != first.device_mesh.device_type:  # shards offloaded to the CPU: NCCL
        value = value.to(first.device_mesh.device_type)  # reduces on the (current) accelerator
    for dim, placement in enumerate(first.placements):
        if not placement.is_replicate():  # Shard, or FSDP2's _StridedShard under TP (not is_shard())
            op = dist.ReduceOp.MAX if inf else dist.ReduceOp.SUM
            dist.all_reduce(value, op=op, group=first.device_mesh.get_group(dim))
    return value if inf else torch.pow(value, 1.0 / norm_type)


def _replicated(tensor: torch.Tensor) -> torch.Tensor:
    """The whole value of the DTensor ``tensor`` (a norm: it has one element), reduced over its
    partial mesh dimensions one at a time (see [Note: a norm over several meshes])."""
    from torch.distributed.tensor import DTensor, Replicate

    assert isinstance(tensor, DTensor)
    for dim, placement in enumerate(tensor.placements):
        if not placement.is_replicate():
            placements = [*tensor.placements]
            placements[dim] = Replicate()
            tensor = tensor.redistribute(tensor.device_mesh, placements)
    return tensor.to_local()


STEP_METHODS = ("training_step", "validation_step", "test_step", "predict_step")


def register_step_methods(module: nn.Module) -> None:
    """Have the FSDP2 root ``module`` run its all-gathers and hooks around each step method it
    has, as around ``forward`` (see [Note: forward redirection] in forward_redirection.py)."""
    from torch.distributed.fsdp import register_fsdp_forward_method

    for method in STEP_METHODS:
        if callable(getattr(module, method, None)):
            register_fsdp_forward_method(module, method)


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
    if coefficient.device.type == "cpu" and float(coefficient) == 1.0:
        return total  # nothing to scale (reading it would wait for a GPU; on the CPU it is free)
    cast: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
    for p in params:
        grad = p.grad
        assert grad is not None  # filtered above
        local = grad.to_local() if isinstance(grad, DTensor) else grad
        key = (local.device, local.dtype)
        if key not in cast:
            cast[key] = coefficient.to(local.device, local.dtype)
        local.mul_(cast[key])
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


class DTensorSteps:
    """The step overrides of a strategy whose parameters are DTensors (FSDP2, with or without
    tensor parallelism): clipping by the whole model's norm over every mesh, accumulation without
    a reduction, and each parameter's full size and local share. Listed before the strategy's
    base class, so these replace the base's."""

    if TYPE_CHECKING:
        precision: Precision

        def _require_model(self) -> nn.Module: ...

    def clip_gradients_norm(
        self, optimizer: Optimizer, max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Clip by the norm over all shards: each process takes the norm of its shards, reduced
        over the mesh once per mesh dimension (see [Note: a norm over several meshes]; torch's
        ``clip_grad_norm_`` on the DTensors takes 2.2-2.9x the time on CPU: docs/benchmarks.md,
        "Gradient clipping under FSDP2")."""
        self.precision.unscale_gradients(optimizer)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        return clip_grad_norm_over_meshes(params, max_norm, float(norm_type))

    def no_backward_sync(self, enabled: bool) -> contextlib.AbstractContextManager[Any]:
        """Accumulate without the reduce-scatter while ``enabled``; a model with no FSDP2 root
        (tensor parallelism alone, under ModelParallelStrategy) has no reduction to skip."""
        from torch.distributed.fsdp import FSDPModule

        model = self._require_model()
        if not enabled or not isinstance(model, FSDPModule):
            return contextlib.nullcontext()
        return no_gradient_sync(model)

    def parameter_sizes(self, module: nn.Module) -> list[ParameterSize]:
        """A sharded parameter is a DTensor: its shape is the full one, its local tensor this rank's share."""
        return dtensor_parameter_sizes(module)
