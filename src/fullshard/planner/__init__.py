"""The memory planner: predict each process's peak memory, activations included, for every FSDP
configuration of a model, and choose the fastest that fits (docs/fsdp/plan.md).

- :func:`plan` (also ``fullshard.plan``): the prediction and the choice, a :class:`MemoryPlan`
  (``Plan``, its older name), whose rows' :class:`Candidate` builds the strategy that runs it.
- ``fullshard plan SCRIPT:FACTORY ...``: the same from the command line (:mod:`fullshard.cli.plan`).
- ``FSDPStrategy(plan="auto")`` / ``FSDP2Strategy(plan="auto")`` / ``strategy="fsdp_auto"``: plan
  before wrapping and apply the choice.

Files: ``api.py`` (:func:`plan`), ``candidates.py`` (what to weigh, fewer-layer simulation),
``simulate.py`` (one fake step), ``cost.py`` (the step-time model), ``result.py`` (rows, table,
choice), ``config.py`` (candidates, device numbers, sizes), ``torch_tools.py`` (torch's private
tools, the only place they are imported).
"""

from fullshard.planner.api import plan
from fullshard.planner.config import Candidate, DeviceSpec
from fullshard.planner.in_strategy import choose as _choose
from fullshard.planner.result import MemoryPlan, MemoryPlanRow, Plan, PlanRow
from fullshard.planner.torch_tools import PlannerUnavailableError
from fullshard.strategies.auto_plan import parse_bytes, register_planner

register_planner(_choose)  # plan="auto": the strategies call it (strategies/auto_plan.py)

__all__ = [
    "Candidate",
    "DeviceSpec",
    "MemoryPlan",
    "MemoryPlanRow",
    "Plan",
    "PlanRow",
    "PlannerUnavailableError",
    "parse_bytes",
    "plan",
]
