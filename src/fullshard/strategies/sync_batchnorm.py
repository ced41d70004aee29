"""``Trainer(sync_batchnorm=True)``: BatchNorm statistics over the whole global batch.

On CUDA the layers become ``torch.nn.SyncBatchNorm`` (``convert_sync_batchnorm``), as in
Lightning. torch's ``SyncBatchNorm`` refuses CPU tensors in training ("SyncBatchNorm expected
input tensor to be on GPU"), so on CPU (gloo) they become :class:`CPUSyncBatchNorm`, a
``SyncBatchNorm`` whose training forward all-reduces the per-channel sums and sums of squares
with an autograd-aware all-reduce: its output and gradients are those of one BatchNorm over the
batches of all processes together, and its running statistics are updated likewise.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.nn.functional import all_reduce

_BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


class CPUSyncBatchNorm(nn.SyncBatchNorm):
    """``SyncBatchNorm`` that also synchronises CPU tensors (gloo); CUDA inputs go to torch's."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        sync = self.training and input.device.type != "cuda" and dist.is_available() and dist.is_initialized()
        group = (self.process_group or dist.group.WORLD) if sync else None
        if not sync or dist.get_world_size(group) == 1:  # CUDA, evaluation or one process: torch's
            return super().forward(input)
        self._check_input_dim(input)
        channels = input.shape[1]
        dims = [0, *range(2, input.dim())]
        count = torch.tensor([input.numel() / channels], dtype=input.dtype, device=input.device)
        stats = torch.cat([input.sum(dims), (input * input).sum(dims), count])
        stats = all_reduce(stats, op=dist.ReduceOp.SUM, group=group)
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
    if isinstance(module, _BATCHNORMS):
        converted: Any = CPUSyncBatchNorm(
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
