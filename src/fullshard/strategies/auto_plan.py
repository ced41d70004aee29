"""``plan=`` of the FSDP strategies, checked where they are built, and the planner they call for
``plan="auto"`` ([Note: plan="auto"] in fullshard.planner.in_strategy).

The planner sits above the strategies (it simulates them), so a strategy does not import it: the
planner registers its chooser here when it is imported (``import fullshard`` imports it), and a
strategy asks :func:`planner` for it when it plans.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fullshard.errors import MisconfigurationError

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_bytes(value: int | float | str, option: str = "device_memory") -> int:
    """Bytes from ``80GiB``, ``"80 GB"``, ``"512MiB"`` or a number of bytes.

    Raises:
        MisconfigurationError: the value is not a positive, finite size (naming ``option``, what
            was given and what is accepted).
    """
    accepted = "a positive number of bytes, or a string such as '80GiB' or '512MB'"
    given = value
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise MisconfigurationError(
            f"{option}={value!r} ({type(value).__name__}) is not a size. Pass {accepted}."
        )
    if isinstance(value, str):
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise MisconfigurationError(
                f"{option}={value!r} is not a size. Write a number and a unit (B, KB, MB, GB, TB, KiB, MiB, GiB, "
                "TiB), such as '80GiB'."
            )
        value = float(match.group(1)) * _UNITS[unit]
    # NaN, inf (a float past its range too: '1e400'), 0, negative, less than a byte
    if (isinstance(value, float) and not math.isfinite(value)) or value < 1:
        raise MisconfigurationError(
            f"{option}={given!r} must be a positive size (finite, at least one byte): pass {accepted}."
        )
    return int(value)


@dataclass(frozen=True)
class AutoPlanSetting:
    """The settings of ``plan="auto"``, checked once at construction: the example batch, each
    process's device memory and each node's host memory (bytes; None: read from the CUDA device,
    not checked)."""

    batch: Any
    device_memory: int | None
    headroom: float
    host_memory: int | None = None


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
    plan: Any,
    batch: Any,
    device_memory: Any,
    *,
    given: dict[str, Any],
    headroom: float = 0.05,
    host_memory: Any = None,
) -> AutoPlanSetting | None:
    """``plan=`` and its companions (``plan_batch``, ``plan_device_memory``, ``plan_host_memory``)
    -> :class:`AutoPlanSetting` (None: no planning).

    Raises:
        MisconfigurationError: ``plan`` is not None or ``"auto"``, a companion comes without
            ``plan="auto"``, a size is not one (:func:`parse_bytes`), or ``plan="auto"`` comes with a
            setting it would replace.
    """
    if plan is None:
        if batch is not None or device_memory is not None or host_memory is not None:
            raise MisconfigurationError(
                "plan_batch=, plan_device_memory= and plan_host_memory= are for plan='auto', which was not given. "
                "Pass plan='auto', or remove them."
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
        batch,
        None if device_memory is None else parse_bytes(device_memory, "plan_device_memory"),
        headroom,
        None if host_memory is None else parse_bytes(host_memory, "plan_host_memory"),
    )


_CHOOSER: list[Callable[..., Any]] = []  # the planner's, registered by fullshard.planner


def register_planner(choose: Callable[..., Any]) -> None:
    """Make ``choose`` the chooser of ``plan="auto"`` (the planner registers its own)."""
    _CHOOSER[:] = [choose]


def planner() -> Callable[..., Any]:
    """The chooser of ``plan="auto"``.

    Raises:
        MisconfigurationError: no planner registered (``fullshard.planner`` was never imported).
    """
    if not _CHOOSER:
        raise MisconfigurationError(
            "plan='auto' needs fullshard's planner, which was not imported: import fullshard (or "
            "fullshard.planner) before building the strategy."
        )
    return _CHOOSER[0]
