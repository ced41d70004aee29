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

import importlib.util
from collections.abc import Mapping
from typing import Any

from torch import nn

from fullshard.errors import MisconfigurationError

TP_PLAN_HINT = (
    "Pass a dict from module names (relative to your fullshard.Module; '*' matches one name part, e.g. "
    "'model.layers.*.attention.wq') to torch.distributed.tensor.parallel styles (ColwiseParallel(), "
    "RowwiseParallel(), SequenceParallel(), ...), or 'auto' for a Hugging Face model's own plan."
)


def check_tensor_parallel(tensor_parallel_size: Any, tp_plan: Any) -> int:
    """``tensor_parallel_size`` as an int, after checking it and ``tp_plan`` against each other."""
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
        if importlib.util.find_spec("fullshard.strategies.tp_plan") is None:
            raise MisconfigurationError(
                "tp_plan='auto' reads a Hugging Face model's own plan through fullshard.strategies.tp_plan, which "
                "this version of fullshard does not have yet. Pass the plan as a dict instead."
            )
        return tensor_parallel_size
    if not isinstance(tp_plan, Mapping) or not tp_plan:
        raise MisconfigurationError(
            f"tp_plan must be a non-empty dict or 'auto', got {type(tp_plan).__name__}. {TP_PLAN_HINT}"
        )
    from torch.distributed.tensor.parallel import ParallelStyle

    for name, style in tp_plan.items():
        if not isinstance(name, str) or not isinstance(style, ParallelStyle):
            raise MisconfigurationError(
                f"tp_plan[{name!r}] is {type(style).__name__}, not a torch.distributed.tensor.parallel style. {TP_PLAN_HINT}"
            )
    return tensor_parallel_size


def apply_tp_plan(module: nn.Module, tp_mesh: Any, tp_plan: Any) -> None:
    """Split ``module``'s layers over ``tp_mesh`` as ``tp_plan`` says (see [Note: FSDP2 with a
    tensor-parallel plan]); ``"auto"``: the plan a Hugging Face model inside ``module`` carries."""
    from torch.distributed.tensor.parallel import parallelize_module

    if tp_plan == "auto":
        from fullshard.strategies.tp_plan import resolve_tp_plan  # type: ignore[import-not-found,unused-ignore]

        tp_plan = resolve_tp_plan(module, tp_plan)
    parallelize_module(module, tp_mesh, dict(tp_plan))
