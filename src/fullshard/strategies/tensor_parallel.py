"""The one 2-D set-up: tensor parallelism and FSDP2 on a ``("data_parallel", "tensor_parallel")``
mesh, under its two public names.

[Note: FSDP2 with a tensor-parallel plan]
``ModelParallelStrategy(data_parallel_size=D, tensor_parallel_size=T)`` (Lightning's) is the
2-D path: it lays the job out with :func:`tensor_parallel_layout` ([Note: the 2-D mesh layout]
in fullshard.strategies.model_parallel), builds the mesh, and the user's ``configure_model``
applies ``parallelize_module`` over ``device_mesh["tensor_parallel"]`` and ``fully_shard`` over
``device_mesh["data_parallel"]``. ``FSDP2Strategy(tensor_parallel_size=T, tp_plan=P)`` is its
preset with ``D="auto"`` where the strategy does that parallelisation itself: the same layout
function and mesh, :func:`parallelize` with ``P`` over the tensor-parallel sub-mesh, then what
FSDP2Strategy always does (activation checkpointing, ``fully_shard`` per unit of the auto-wrap
policy, the root last) over the data-parallel one. So the plan sees the user's modules as they
wrote them, FSDP2 shards DTensors already split between the tensor-parallel ranks, and both
names train, clip, skip gradient syncs and count parameters with the same code (both strategies
take these overrides from :class:`~fullshard.strategies.dtensor_ops.DTensorSteps`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from torch import nn

from fullshard.errors import MisconfigurationError
from fullshard.strategies.parallel_layout import MESH_DIM_NAMES, ParallelLayout

TP_PLAN_HINT = (
    "Pass a dict from module-name patterns (relative to your fullshard.Module; '*' stands for one name part, e.g. "
    "'model.layers.*.self_attn.q_proj') to torch.distributed.tensor.parallel styles (ColwiseParallel(), "
    "RowwiseParallel(), SequenceParallel(), ...) or style strings ('colwise', 'rowwise', ...), or 'auto' for a "
    "Hugging Face model's own plan (docs/fsdp/tp-plans.md)."
)


def check_mesh_size(name: str, value: Any) -> int | Literal["auto"]:
    """``data_parallel_size``/``tensor_parallel_size`` of ``ModelParallelStrategy``, checked."""
    if value == "auto" and isinstance(value, str):
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise MisconfigurationError(
            f"{name}={value!r} is invalid: pass a positive int (a number of processes) or 'auto' "
            f"(tensor_parallel_size: the processes per machine; data_parallel_size: the number of machines). "
            f"For example ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=2) on 4 processes."
        )
    return value


def tensor_parallel_layout(
    world_size: int,
    data_parallel: int | Literal["auto"],
    tensor_parallel: int | Literal["auto"],
    *,
    num_nodes: int | None,
    owner: str,
) -> ParallelLayout:
    """The ``("data_parallel", "tensor_parallel")`` layout of ``world_size`` processes on
    ``num_nodes`` machines (None: not known, for a layout planned ahead), for both 2-D
    strategies ([Note: FSDP2 with a tensor-parallel plan]); rank ``r`` is replica
    ``r // tensor_parallel`` ([Note: the 2-D mesh layout] in fullshard.strategies.model_parallel).
    ``"auto"`` for both: a tensor-parallel group per machine; for one: what the other leaves.

    Raises:
        MisconfigurationError: the sizes do not multiply to ``world_size`` (``owner``: the
            strategy as the user wrote it, named in the message).
    """
    dp, tp = data_parallel, tensor_parallel
    nodes = num_nodes or 1
    per_node = world_size // nodes
    if dp == "auto" and tp == "auto":
        dp, tp = nodes, per_node
    elif dp == "auto":
        assert tp != "auto"
        dp = world_size // tp if world_size % tp == 0 else 0
    elif tp == "auto":
        tp = world_size // dp if world_size % dp == 0 else 0
    if dp * tp != world_size:
        raise MisconfigurationError(
            f"{owner} cannot lay out the job's {world_size} processes"
            + (f" (num_nodes={num_nodes} x devices={per_node})" if num_nodes else "")
            + f": data_parallel_size x tensor_parallel_size must equal {world_size}. Choose sizes whose product is "
            f"{world_size} (e.g. data_parallel_size={nodes}, tensor_parallel_size={per_node}), or leave one "
            "of them 'auto'."
        )
    return ParallelLayout(replicas=1, shards=dp, tensor_parallel=tp, mesh_dims=MESH_DIM_NAMES)


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
    """Split ``module``'s layers over ``tp_mesh`` as ``tp_plan`` says, resolved against
    ``module`` and applied by :mod:`fullshard.strategies.tp_plan` (``"auto"``: a Hugging Face
    model's own plan); see [Note: FSDP2 with a tensor-parallel plan]."""
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
