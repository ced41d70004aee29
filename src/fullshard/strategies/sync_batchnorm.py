"""``Trainer(sync_batchnorm=True)``: BatchNorm statistics over the whole global batch.

On CUDA the layers become ``torch.nn.SyncBatchNorm`` (``convert_sync_batchnorm``), as in
Lightning. torch's ``SyncBatchNorm`` refuses CPU tensors in training ("SyncBatchNorm expected
input tensor to be on GPU"), and DDP refuses it in a CPU module ("SyncBatchNorm layers only work
with GPU modules"), so on CPU (gloo) a ``BatchNorm1d/2d/3d`` becomes the same class with
:class:`CPUSyncBatchNorm` mixed in: its training forward all-reduces the per-channel sums and
sums of squares with an autograd-aware all-reduce, so its output and gradients are those of one
BatchNorm over the batches of all processes together, and its running statistics are updated
likewise (with the unbiased variance of the global batch, as torch's).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn


class _SumOverProcesses(torch.autograd.Function):
    """``all_reduce(SUM)`` with its gradient (the sum of every process's gradient): written here
    because ``torch.distributed.nn.functional.all_reduce`` is deprecated and its replacement is
    private."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        summed = tensor.clone()
        dist.all_reduce(summed, op=dist.ReduceOp.SUM, group=group)
        return summed

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        summed = grad.contiguous().clone()
        dist.all_reduce(summed, op=dist.ReduceOp.SUM, group=ctx.group)
        return summed, None


# _NormBase (torch-private) is the common base of the BatchNorm classes; the mixin derives from it
# only so that its attributes (eps, momentum, running_mean, ...) are typed
class CPUSyncBatchNorm(nn.modules.batchnorm._NormBase):
    """Mixed into ``BatchNorm1d/2d/3d``: training statistics over every process (gloo, CPU)."""

    process_group: Any = None  # None: all processes

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        sync = self.training and dist.is_available() and dist.is_initialized()
        group = (self.process_group or dist.group.WORLD) if sync else None
        if not sync or dist.get_world_size(group) == 1:  # evaluation or one process: a BatchNorm
            return super().forward(input)  # type: ignore[no-any-return]
        self._check_input_dim(input)
        channels = input.shape[1]
        dims = [0, *range(2, input.dim())]
        count = torch.tensor([input.numel() / channels], dtype=input.dtype, device=input.device)
        stats = torch.cat([input.sum(dims), (input * input).sum(dims), count])
        stats = _SumOverProcesses.apply(stats, group)
        total = stats[-1]
        mean = stats[:channels] / total
        var = (stats[channels : 2 * channels] / total - mean * mean).clamp_min(0)
        if self.track_running_stats and self.running_mean is not None and self.running_var is not None:
            self._update_running(mean.detach(), var.detach() * total.detach() / (total.detach() - 1))
        shape = [1, channels] + [1] * (input.dim() - 2)
        out: torch.Tensor = (input - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out

    def _momentum(self) -> float:
        if self.momentum is not None:
            return self.momentum
        tracked = int(self.num_batches_tracked) if self.num_batches_tracked is not None else 0
        return 1.0 / max(tracked, 1)  # a cumulative moving average

    @torch.no_grad()
    def _update_running(self, mean: torch.Tensor, unbiased_var: torch.Tensor) -> None:
        if self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
        factor = self._momentum()
        assert self.running_mean is not None and self.running_var is not None
        self.running_mean.mul_(1 - factor).add_(mean, alpha=factor)
        self.running_var.mul_(1 - factor).add_(unbiased_var, alpha=factor)


def convert_sync_batchnorm(module: nn.Module, device: torch.device) -> nn.Module:
    """``module`` with its BatchNorm layers synchronised across processes: torch's
    ``SyncBatchNorm`` on CUDA, :class:`CPUSyncBatchNorm` otherwise. Layers are replaced in place
    (the module itself is returned new only when it is a BatchNorm)."""
    if device.type == "cuda":
        converted: nn.Module = nn.SyncBatchNorm.convert_sync_batchnorm(module)
        return converted
    return _convert(module)


def _convert(module: nn.Module) -> nn.Module:
    target = _CONVERSIONS.get(type(module))
    if target is not None:
        assert isinstance(module, nn.modules.batchnorm._NormBase)
        converted: Any = target(
            module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats
        )
        if module.affine:
            with torch.no_grad():
                converted.weight = module.weight
                converted.bias = module.bias
        converted.running_mean = module.running_mean
        converted.running_var = module.running_var
        converted.num_batches_tracked = module.num_batches_tracked
        converted.train(module.training)
        return converted  # type: ignore[no-any-return]
    for name, child in module.named_children():
        new = _convert(child)
        if new is not child:
            module.add_module(name, new)
    return module


class CPUSyncBatchNorm1d(CPUSyncBatchNorm, nn.BatchNorm1d):
    """``BatchNorm1d`` synchronised across CPU processes."""


class CPUSyncBatchNorm2d(CPUSyncBatchNorm, nn.BatchNorm2d):
    """``BatchNorm2d`` synchronised across CPU processes."""


class CPUSyncBatchNorm3d(CPUSyncBatchNorm, nn.BatchNorm3d):
    """``BatchNorm3d`` synchronised across CPU processes."""


_CONVERSIONS: dict[type[nn.Module], type[nn.Module]] = {
    nn.BatchNorm1d: CPUSyncBatchNorm1d,
    nn.BatchNorm2d: CPUSyncBatchNorm2d,
    nn.BatchNorm3d: CPUSyncBatchNorm3d,
}
