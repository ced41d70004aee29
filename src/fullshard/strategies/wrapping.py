"""Each FSDP engine's wrapping, as a function of plain arguments: the strategies call it from
``_wrap`` over the job's layout and mesh, and the memory planner calls the same function over a
simulated job's (one implementation of wrapping: [Note: how a candidate is simulated] in
fullshard.planner.simulate).

- :func:`fully_shard_model` (FSDP2): activation checkpointing wrappers, then ``fully_shard`` on
  each selected block, children first, then on the root (see [Note: FSDP2 units, bottom-up] in
  fullshard.strategies.fsdp2), over the data-parallel part of a ``ParallelLayout``'s mesh.
- :func:`wrap_fsdp1` (FSDP1): one ``FullyShardedDataParallel`` around the model with the auto-wrap
  policy's units inside it, then activation checkpointing on the wrapped model.

What the strategies add around them (tensor parallelism first, the check of what
``configure_model`` wrapped by hand, compiling, the step methods) stays in the strategies.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from fullshard.strategies.meta_init import children_first
from fullshard.strategies.parallel_layout import ParallelLayout

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from fullshard.policies import Policy


def apply_checkpointing(module: nn.Module, checkpointing: Policy | None) -> dict[nn.Module, nn.Module]:
    """Wrap the modules ``checkpointing`` selects in ``module`` in a ``CheckpointWrapper``
    (non-reentrant), before FSDP2 shards them. Returns the wrapper of each wrapped module."""
    if checkpointing is None:
        return {}
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        CheckpointWrapper,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    selected = set(checkpointing.selected(module))
    wrapper = partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
    apply_activation_checkpointing(module, checkpoint_wrapper_fn=wrapper, check_fn=lambda m: m in selected)
    return {m._checkpoint_wrapped_module: m for m in module.modules() if isinstance(m, CheckpointWrapper)}


def fully_shard_model(
    module: nn.Module,
    layout: ParallelLayout,
    mesh: DeviceMesh | None,
    *,
    auto_wrap: Policy | None,
    checkpointing: Policy | None,
    reshard_after_forward: bool | int,
    init: Callable[[nn.Module], None] | None = None,
    **fully_shard_kwargs: Any,
) -> list[nn.Module]:
    """Shard ``module`` in place with FSDP2, unit by unit (see [Note: FSDP2 units, bottom-up] in
    fullshard.strategies.fsdp2).

    Args:
        module: the model; its policies already resolved against it.
        layout, mesh: the job's layout and the mesh it built (over a fake process group when
            planning); FSDP2 shards over :meth:`ParallelLayout.data_parallel_mesh`. None: torch's
            default mesh over every process.
        auto_wrap: the blocks to make units (None: the root only); ``checkpointing``: the modules to
            recompute in backward (wrapped first; a selected block inside a wrapper is sharded
            through its wrapper).
        reshard_after_forward: the blocks' setting; the root keeps its parameters from forward to
            backward (torch's default for it) unless nothing is resharded anyway.
        init: called on each unit just before it is sharded, then on the root (``empty_init``).
        **fully_shard_kwargs: the rest of every ``fully_shard`` call (``mp_policy``, ``offload_policy``, ...).

    Returns:
        The blocks made units, children first (as found before checkpointing wrapped them).
    """
    from torch.distributed.fsdp import fully_shard

    shard_mesh = None if mesh is None else layout.data_parallel_mesh(mesh)
    chosen = set([] if auto_wrap is None else auto_wrap.selected(module))
    float32 = set(batch_norms_kept_in_float32(module, fully_shard_kwargs.get("mp_policy")))
    wrappers = apply_checkpointing(module, checkpointing)
    order = children_first(list(module.modules()))
    blocks = [m for m in order if m in chosen and m is not module]
    for part in [m for m in order if (m in chosen or m in float32) and m is not module]:
        unit = wrappers.get(part, part)
        if init is not None:
            init(unit)
        kwargs = fully_shard_kwargs
        if part in float32:  # see [Note: BatchNorm under FSDP2 mixed precision]
            kwargs = {**fully_shard_kwargs, "mp_policy": _float32_policy(fully_shard_kwargs["mp_policy"])}
        fully_shard(unit, mesh=shard_mesh, reshard_after_forward=reshard_after_forward, **kwargs)
    if init is not None:
        init(module)
    root_reshard = None if reshard_after_forward is True else reshard_after_forward
    fully_shard(module, mesh=shard_mesh, reshard_after_forward=root_reshard, **fully_shard_kwargs)
    return blocks


# [Note: BatchNorm under FSDP2 mixed precision]
# A MixedPrecisionPolicy with a half param_dtype gathers a BatchNorm's weight and bias in half
# precision, but FSDP2 casts no buffers, so its running mean and variance stay float32 and
# ``batch_norm`` refuses the mix ("expected scalar type BFloat16 but found Float"): a ResNet under
# bf16-mixed could not train. FSDP1 avoids it by default (MixedPrecision's
# ``_module_classes_to_ignore=(_BatchNorm,)``: each BatchNorm is its own unit without mixed
# precision); FSDP2 has no such default, so fully_shard_model does the same: each BatchNorm with
# parameters becomes its own unit (children first, before the block holding it) whose policy keeps
# the parameters float32, as they are without FSDP. Under autocast its half input meets float32
# weight and statistics, which batch_norm takes (as it does without FSDP); the cost is one small
# all-gather and reduce-scatter per BatchNorm, as under FSDP1. FSDP1 does it only when it wraps by
# a policy: without one, wrap_fsdp1 gives it a policy that selects no block.
BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def batch_norms_kept_in_float32(module: nn.Module, mp_policy: Any) -> list[nn.Module]:
    """The BatchNorm modules of ``module`` (not itself) that ``fully_shard_model`` shards as their
    own float32 units under ``mp_policy`` (a ``MixedPrecisionPolicy`` or None): those with
    parameters, when the policy gathers parameters in another dtype."""
    param_dtype = getattr(mp_policy, "param_dtype", None)
    if param_dtype is None or param_dtype == torch.float32:
        return []
    return [
        m
        for m in module.modules()
        if m is not module and isinstance(m, BATCH_NORMS) and any(True for _ in m.parameters(recurse=False))
    ]


def _float32_policy(policy: Any) -> Any:
    """``policy`` without its parameter dtype: parameters and gradient reductions in float32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(
        output_dtype=policy.output_dtype, cast_forward_inputs=policy.cast_forward_inputs
    )


def wrap_fsdp1(
    module: nn.Module, *, auto_wrap: Policy | None, checkpointing: Policy | None, **fsdp_kwargs: Any
) -> nn.Module:
    """Wrap ``module`` in FSDP1's ``FullyShardedDataParallel``, ``auto_wrap``'s blocks as units
    inside it, then wrap ``checkpointing``'s modules (by class where it names classes) in
    non-reentrant ``CheckpointWrapper``\\ s. ``fsdp_kwargs``: the rest of the constructor's
    arguments (``sharding_strategy``, ``mixed_precision``, ``device_mesh``, ``use_orig_params``, ...)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )
    from torch.distributed.fsdp import FullyShardedDataParallel

    if auto_wrap is not None:
        fsdp_kwargs["auto_wrap_policy"] = auto_wrap.torch_policy()
    elif batch_norms_kept_in_float32(module, fsdp_kwargs.get("mixed_precision")):
        # torch keeps BatchNorm in float32 only when wrapping by a policy: one that selects
        # nothing else ([Note: BatchNorm under FSDP2 mixed precision])
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        fsdp_kwargs["auto_wrap_policy"] = ModuleWrapPolicy(set())
    wrapped = FullyShardedDataParallel(module, **fsdp_kwargs)
    if checkpointing is not None:
        wrapper = partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        if checkpointing.classes:
            classes = tuple(checkpointing.classes)
            apply_activation_checkpointing(
                wrapped, checkpoint_wrapper_fn=wrapper, check_fn=lambda m: isinstance(m, classes)
            )
        else:
            apply_activation_checkpointing(
                wrapped, checkpoint_wrapper_fn=wrapper, auto_wrap_policy=checkpointing.torch_policy()
            )
    return wrapped
