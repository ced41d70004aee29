"""Tensor parallelism inside ``FSDP2Strategy``: its arguments checked, and the plan applied over
the tensor-parallel sub-mesh before FSDP2 shards over the data-parallel one.

[Note: FSDP2 with a tensor-parallel plan]
``FSDP2Strategy(tensor_parallel_size=T, tp_plan=...)`` lays the job's processes out as
ModelParallelStrategy does (``("data_parallel", "tensor_parallel")``, rank ``r`` in replica
``r // T``: [Note: the 2-D mesh layout] in fullshard.strategies.model_parallel), applies the plan
with torch's ``parallelize_module`` over the ``"tensor_parallel"`` sub-mesh, and then does what it
always does (activation checkpointing, ``fully_shard`` per unit of the auto-wrap policy, the
root last) over the ``"data_parallel"`` sub-mesh. So the plan sees the user's modules as they
wrote them, and FSDP2 shards DTensors that are already split between the tensor-parallel ranks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from fullshard.errors import MisconfigurationError

TP_PLAN_HINT = (
    "Pass a dict from module-name patterns (relative to your fullshard.Module; '*' stands for one name part, e.g. "
    "'model.layers.*.self_attn.q_proj') to torch.distributed.tensor.parallel styles (ColwiseParallel(), "
    "RowwiseParallel(), SequenceParallel(), ...) or style strings ('colwise', 'rowwise', ...), or 'auto' for a "
    "Hugging Face model's own plan (docs/fsdp/tp-plans.md)."
)


def check_tensor_parallel(tensor_parallel_size: Any, tp_plan: Any) -> int:
    """``tensor_parallel_size`` as an int, after checking it and ``tp_plan`` against each other.
    What the plan names is checked against the model when it is applied
    (:func:`~fullshard.strategies.tp_plan.resolve_tp_plan`)."""
    if (
        isinstance(tensor_parallel_size, bool)
        or not isinstance(tensor_parallel_size, int)
        or tensor_parallel_size < 1
    ):
        raise MisconfigurationError(
            f"tensor_parallel_size={tensor_parallel_size!r} is invalid: pass the number of processes one layer "
            "is split over (an int >= 1; 1, the default, turns tensor parallelism off)."
        )
    if tp_plan is None:
        if tensor_parallel_size > 1:
            raise MisconfigurationError(
                f"tensor_parallel_size={tensor_parallel_size} needs tp_plan=: which layers to split and how. "
                + TP_PLAN_HINT
            )
        return tensor_parallel_size
    if tensor_parallel_size == 1:
        raise MisconfigurationError(
            "tp_plan= was given with tensor_parallel_size=1, which splits nothing. Pass tensor_parallel_size=N "
            "(processes per layer, e.g. the GPUs of one machine), or drop tp_plan."
        )
    if isinstance(tp_plan, str):
        if tp_plan != "auto":
            raise MisconfigurationError(f"tp_plan={tp_plan!r} is not a plan. {TP_PLAN_HINT}")
        return tensor_parallel_size
    if not isinstance(tp_plan, Mapping) or not tp_plan:
        raise MisconfigurationError(
            f"tp_plan must be a non-empty dict or 'auto', got {type(tp_plan).__name__}. {TP_PLAN_HINT}"
        )
    from fullshard.strategies.tp_plan import ACCEPTED_STYLES

    for name, style in tp_plan.items():
        if isinstance(style, str) and style in ACCEPTED_STYLES:
            continue
        from torch.distributed.tensor.parallel import ParallelStyle

        if not isinstance(name, str) or not isinstance(style, ParallelStyle):
            raise MisconfigurationError(
                f"tp_plan[{name!r}] is {style!r}, neither a torch.distributed.tensor.parallel style nor one of "
                f"{', '.join(map(repr, ACCEPTED_STYLES))}. {TP_PLAN_HINT}"
            )
    return tensor_parallel_size


def parallelize(module: nn.Module, tp_mesh: Any, tp_plan: Any) -> None:
    """Split ``module``'s layers over ``tp_mesh`` as ``tp_plan`` says (see [Note: FSDP2 with a
    tensor-parallel plan]): resolved against ``module`` and applied by
    :mod:`fullshard.strategies.tp_plan` (``"auto"``: a Hugging Face model's own plan)."""
    from fullshard.strategies.tp_plan import apply_tp_plan, resolve_tp_plan

    apply_tp_plan(module, tp_mesh, resolve_tp_plan(module, tp_plan))


def refuse_compile_with_checkpointing(checkpointed: bool, compiled: bool, where: str) -> None:
    """Refuse ``compile=`` together with activation checkpointing of tensor-parallel layers, which
    fails in torch 2.13 at the first backward with an error that does not say why (AOTAutograd:
    "expected all tensors_saved_with_vc_check to be Tensors", a ``DeviceMesh`` among them)."""
    if checkpointed and compiled:
        raise MisconfigurationError(
            f"compile= with activation checkpointing of tensor-parallel layers ({where}) fails in torch 2.13 at the "
            "first backward (AOTAutograd saves a DeviceMesh among the tensors it checks). Use one of the two: "
            "drop compile=, or the activation checkpointing."
        )
