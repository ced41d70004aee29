"""FSDP's options, parsed without importing ``torch.distributed.fsdp`` until one is used: the
sharding strategy, CPU offload and backward prefetch."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

from fullshard.errors import MisconfigurationError

if TYPE_CHECKING:
    from torch.distributed.fsdp import CPUOffload


def torch_fsdp() -> Any:
    """``torch.distributed.fsdp``, imported on first use.

    Importing it pulls in DTensor and costs about 0.7 s; jobs that never use FSDP should not pay
    that at start-up, so this module imports it only when an FSDPStrategy is built.
    """
    import torch.distributed.fsdp

    return torch.distributed.fsdp


# torch.distributed.fsdp.ShardingStrategy's names, known without importing it (see torch_fsdp)
SHARDING_NAMES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")


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
