"""FSDP's options, parsed without importing ``torch.distributed.fsdp`` until one is used: the
sharding strategy, CPU offload, mixed precision and backward prefetch of FSDP1
(``FSDPStrategy``) and FSDP2 (``FSDP2Strategy``), and the device mesh both take.

[Note: torch's FSDP imported after launch]
A strategy is built in the user's process before the other processes start, so importing
torch's FSDP there (0.7 s, it pulls in DTensor) would be paid once before the launch and once
more in every started process, one after the other. Plain values (a sharding name, a bool) are
checked without it; torch objects are checked against their types only when given (their owner
imported them already).
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

from fullshard.errors import MisconfigurationError

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import CPUOffload, OffloadPolicy


def torch_fsdp() -> Any:
    """``torch.distributed.fsdp``, imported on first use.

    Importing it pulls in DTensor and costs about 0.7 s; jobs that never use FSDP should not pay
    that at start-up, so this module imports it only when an FSDPStrategy is built.
    """
    import torch.distributed.fsdp

    return torch.distributed.fsdp


# torch.distributed.fsdp.ShardingStrategy's names, known without importing it (see torch_fsdp)
SHARDING_NAMES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")
HYBRID_NAMES = ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")  # shard within a group, replicate across groups
FSDP2_SHARDING = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD")


def sharding_name(value: Any, accepted: tuple[str, ...] = SHARDING_NAMES, owner: str = "") -> str:
    """``"FULL_SHARD"`` (any case) or a torch ``ShardingStrategy`` -> its name, checked against
    ``accepted`` without importing torch's FSDP (a user who passes the enum has imported it)."""
    if isinstance(value, enum.Enum) and type(value).__name__ == "ShardingStrategy":
        name: Any = value.name
    else:
        name = value.upper() if isinstance(value, str) else None
    if name in accepted:
        return str(name)
    valid = ", ".join(repr(n) for n in accepted if not n.startswith("_"))
    raise MisconfigurationError(
        f"sharding_strategy={value!r} is not a sharding strategy{owner}. Use one of {valid} (any case), "
        "or a torch.distributed.fsdp.ShardingStrategy of those names."
    )


def check_device_mesh(value: Any) -> tuple[int, int] | DeviceMesh | None:
    """``device_mesh=``: None, a ``(replicas, shard_size)`` tuple of positive ints or a ``DeviceMesh``."""
    if value is None:
        return None
    if isinstance(value, tuple):
        if len(value) != 2 or not all(isinstance(d, int) and d > 0 for d in value):
            raise MisconfigurationError(
                f"device_mesh={value!r} must be a tuple of two positive ints: (replicas, shard_size)."
            )
        return value  # type: ignore[return-value]
    from torch.distributed.device_mesh import DeviceMesh

    if not isinstance(value, DeviceMesh):
        raise TypeError(
            f"device_mesh must be a (replicas, shard_size) tuple or a DeviceMesh, got {type(value).__name__}."
        )
    return value


# ------------------------------------------------------------------------------------- FSDP1
def parse_cpu_offload(value: Any) -> CPUOffload:
    """``True``/``False``/``None`` or a torch ``CPUOffload`` -> ``CPUOffload``."""
    offload = torch_fsdp().CPUOffload
    if isinstance(value, offload):
        return value  # type: ignore[no-any-return]
    if value is None or isinstance(value, bool):
        return offload(offload_params=bool(value))  # type: ignore[no-any-return]
    raise TypeError(
        f"cpu_offload={value!r} ({type(value).__name__}) cannot be used: pass True, False, or "
        "torch.distributed.fsdp.CPUOffload(offload_params=True)."
    )


def parse_backward_prefetch(value: Any) -> Any:
    prefetch = torch_fsdp().BackwardPrefetch
    if value is None or isinstance(value, prefetch):
        return value
    if isinstance(value, str) and value.upper() in prefetch.__members__:
        return prefetch[value.upper()]
    raise MisconfigurationError(
        f"backward_prefetch={value!r} is invalid: use 'BACKWARD_PRE', 'BACKWARD_POST', None, or a "
        "torch.distributed.fsdp.BackwardPrefetch."
    )


def check_mixed_precision(value: Any) -> Any:
    """FSDP1's ``mixed_precision=``: None or a ``torch.distributed.fsdp.MixedPrecision``."""
    if value is not None:
        from torch.distributed.fsdp import MixedPrecision

        if not isinstance(value, MixedPrecision):
            raise TypeError(
                f"mixed_precision must be a torch.distributed.fsdp.MixedPrecision, got {type(value).__name__}. "
                "For the common settings pass Trainer(precision='bf16-mixed') instead."
            )
    return value


# ------------------------------------------------------------------------------------- FSDP2
def parse_fsdp2_sharding(value: Any) -> tuple[str, bool | int]:
    """FSDP2's ``sharding_strategy=`` -> (the sharding name, ``reshard_after_forward``): a name of
    :data:`FSDP2_SHARDING` (any case) or a ``ShardingStrategy`` of one, or an int: FULL_SHARD
    that reshards after forward to groups of that many processes."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise MisconfigurationError(
                f"sharding_strategy={value} must be a positive int (the size of the groups "
                f"parameters are resharded to after forward) or one of {', '.join(map(repr, FSDP2_SHARDING))}."
            )
        return "FULL_SHARD", value
    name = sharding_name(value, FSDP2_SHARDING, " of FSDP2")
    return name, name != "SHARD_GRAD_OP"


def check_fsdp2_cpu_offload(value: Any) -> bool | OffloadPolicy:
    """FSDP2's ``cpu_offload=``: True, False, None (False) or a ``torch.distributed.fsdp.OffloadPolicy``."""
    if value is None or isinstance(value, bool):
        return bool(value)
    from torch.distributed.fsdp import OffloadPolicy

    if not isinstance(value, OffloadPolicy):
        raise TypeError(
            f"cpu_offload={value!r} ({type(value).__name__}) cannot be used with FSDP2: pass "
            "True, False, or torch.distributed.fsdp.CPUOffloadPolicy()."
        )
    return value


def check_fsdp2_mixed_precision(value: Any) -> Any:
    """FSDP2's ``mixed_precision=``: None or a ``torch.distributed.fsdp.MixedPrecisionPolicy``."""
    if value is None:
        return None
    from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy

    if isinstance(value, MixedPrecision):
        raise TypeError(
            "mixed_precision is FSDP1's torch.distributed.fsdp.MixedPrecision; FSDP2 takes a "
            "torch.distributed.fsdp.MixedPrecisionPolicy(param_dtype=..., reduce_dtype=...). Or pass "
            "Trainer(precision='bf16-mixed') for the common setting."
        )
    if not isinstance(value, MixedPrecisionPolicy):
        raise TypeError(
            f"mixed_precision must be a torch.distributed.fsdp.MixedPrecisionPolicy, got "
            f"{type(value).__name__}. For the common settings pass Trainer(precision='bf16-mixed')."
        )
    return value
