"""``plan="auto"``: the FSDP strategies plan before wrapping and apply the choice.

[Note: plan="auto"]
``FSDPStrategy(plan="auto")`` / ``FSDP2Strategy(plan="auto")`` (``strategy="fsdp_auto"``) run
:func:`fullshard.planner.plan` in ``setup_module``, before the wrap plan: rank 0 plans (in a
forked process: [Note: planning inside a running job]) for the job's processes and nodes, its own
engine only, against the CUDA device's free memory or ``plan_device_memory=`` (and, for the rows
that offload, each node's ``plan_host_memory=``); the choice is broadcast so every rank applies
the same one, and rank 0 logs the table. It weighs every sharding (HYBRID_SHARD on several nodes
of several processes: a replica per node): the processes were laid out (and the mesh built)
before the model was seen, so a choice of HYBRID_SHARD or NO_SHARD lays them out again and
builds its mesh on every rank (``ShardedStrategy._apply_candidate``); the data split is the same
under any of them (every process a data-parallel rank). A layout fixed by hand
(``device_mesh=``, ``process_group=``, tensor parallelism) keeps FULL_SHARD and SHARD_GRAD_OP
only. The choice replaces
``sharding_strategy``, ``auto_wrap_policy``, ``activation_checkpointing_policy`` and ``cpu_offload``
(which must then be left at their defaults). The example batch is ``plan_batch=``, else the
module's ``example_input_array``.
"""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

from fullshard.errors import MisconfigurationError
from fullshard.planner.config import Candidate
from fullshard.planner.result import MemoryPlan
from fullshard.strategies.auto_plan import AutoPlanSetting

log = logging.getLogger("fullshard")


def choose(
    setting: AutoPlanSetting,
    module: nn.Module,
    *,
    engine: str,
    devices: int,
    num_nodes: int,
    device_type: str,
    precision: str,
    is_global_zero: bool,
    broadcast: Any,
    shardings: tuple[str, ...] | None = None,
) -> tuple[Candidate, MemoryPlan | None]:
    """Plan on rank 0, broadcast the chosen candidate; returns it (and the plan on rank 0).
    ``shardings``: those the strategy can lay out (None: all that apply to the job).

    Raises:
        MisconfigurationError: no example batch, or no configuration fits.
    """
    from fullshard.planner.api import plan as run_plan

    batch = setting.batch if setting.batch is not None else getattr(module, "example_input_array", None)
    if batch is None:
        raise MisconfigurationError(
            f"plan='auto' runs one step of {type(module).__name__}.training_step on a batch, but neither plan_batch= "
            "nor the module's example_input_array gives one. Pass plan_batch=<one batch as a process gets it>."
        )
    found: MemoryPlan | None = None
    answer: tuple[Candidate | None, str] = (None, "")
    if is_global_zero:
        try:
            found = run_plan(
                module,
                batch,
                devices=devices,
                num_nodes=num_nodes,
                device_memory=setting.device_memory,
                host_memory=setting.host_memory,
                device_type=device_type,
                precision=precision,
                headroom=setting.headroom,
                engines=(engine,),
                shardings=shardings,
            )
            log.info(found.table())
            answer = (None if found.choice is None else found.choice.candidate, found.table())
        except MisconfigurationError as error:
            answer = (None, f"error: {error}")
    candidate, text = broadcast(answer)
    if candidate is None:
        raise MisconfigurationError(
            "plan='auto' found no configuration to run:\n"
            + text
            + "\nUse more processes, a smaller batch, or "
            "choose the configuration by hand."
        )
    return candidate, found
