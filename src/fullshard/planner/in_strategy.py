"""``plan="auto"``: the FSDP strategies plan before wrapping and apply the choice.

[Note: plan="auto"]
``FSDPStrategy(plan="auto")`` / ``FSDP2Strategy(plan="auto")`` (``strategy="fsdp_auto"``) run
:func:`fullshard.planner.plan` in ``setup_module``, before the wrap plan: rank 0 plans (in a
forked process: [Note: planning inside a running job]) for the job's processes and nodes, its own
engine only, against the CUDA device's free memory or ``plan_device_memory=``; the choice is
broadcast so every rank applies the same one, and rank 0 logs the table. It weighs FULL_SHARD and
SHARD_GRAD_OP only: the processes were laid out (and FSDP2's mesh built) before the model was
seen, and NO_SHARD and HYBRID_SHARD lay them out differently. The choice replaces
``sharding_strategy``, ``auto_wrap_policy``, ``activation_checkpointing_policy`` and ``cpu_offload``
(which must then be left at their defaults). The example batch is ``plan_batch=``, else the
module's ``example_input_array``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from torch import nn

from fullshard.errors import MisconfigurationError
from fullshard.planner.config import Candidate, parse_bytes
from fullshard.planner.result import MemoryPlan

log = logging.getLogger("fullshard")


@dataclass(frozen=True)
class AutoPlanSetting:
    """The settings of ``plan="auto"``, checked once at construction."""

    batch: Any
    device_memory: int | None
    headroom: float


def settings_a_plan_replaces(
    sharding_strategy: Any, auto_wrap_policy: Any, activation_checkpointing_policy: Any, cpu_offload: Any
) -> dict[str, bool]:
    """Which of the settings ``plan="auto"`` chooses itself a strategy was given (its ``given=``)."""
    return {
        "sharding_strategy": sharding_strategy != "FULL_SHARD",
        "auto_wrap_policy": auto_wrap_policy is not None,
        "activation_checkpointing_policy": activation_checkpointing_policy is not None,
        "cpu_offload": bool(cpu_offload),
    }


def check_plan_setting(
    plan: Any, batch: Any, device_memory: Any, *, given: dict[str, Any], headroom: float = 0.1
) -> AutoPlanSetting | None:
    """``plan=`` and its companions -> :class:`AutoPlanSetting` (None: no planning).

    Raises:
        MisconfigurationError: ``plan`` is not None or ``"auto"``, or ``plan="auto"`` comes with a
            setting it would replace.
    """
    if plan is None:
        if batch is not None or device_memory is not None:
            raise MisconfigurationError(
                "plan_batch= and plan_device_memory= are for plan='auto', which was not given. Pass plan='auto', "
                "or remove them."
            )
        return None
    if plan != "auto":
        raise MisconfigurationError(
            f"plan={plan!r} is not accepted: pass plan='auto' to plan before wrapping, or None."
        )
    clashes = [name for name, value in given.items() if value]
    if clashes:
        raise MisconfigurationError(
            f"plan='auto' chooses {', '.join(clashes)} itself, but they were given too. Remove them, or drop "
            "plan='auto' and keep your own."
        )
    return AutoPlanSetting(
        batch, None if device_memory is None else parse_bytes(device_memory, "plan_device_memory"), headroom
    )


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
) -> tuple[Candidate, MemoryPlan | None]:
    """Plan on rank 0, broadcast the chosen candidate; returns it (and the plan on rank 0).

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
                device_type=device_type,
                precision=precision,
                headroom=setting.headroom,
                engines=(engine,),
                # the job's layout (and FSDP2's mesh) was made before the model was seen: shardings over it
                shardings=("FULL_SHARD", "SHARD_GRAD_OP"),
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
