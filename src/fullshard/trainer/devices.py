"""Resolving the Trainer's ``accelerator``, ``devices``, ``num_nodes`` and ``strategy`` arguments
into a configured strategy, and applying its torch settings for the device (``deterministic``,
``benchmark``) in each process."""

from __future__ import annotations

import os
from typing import Any

import torch

from fullshard.errors import MisconfigurationError, MisconfigurationTypeError, did_you_mean
from fullshard.launch import ClusterEnvironment, select_cluster_environment
from fullshard.precision import alias_warning
from fullshard.rank_zero import rank_zero_warn, set_global_rank
from fullshard.strategies import Strategy
from fullshard.trainer.arguments import resolve_strategy


def configured_strategy(
    accelerator: str,
    strategy: Any,
    devices: Any,
    num_nodes: Any,
    precision: Any,
    compile_config: Any,
    sync_batchnorm: bool,
    plugins: Any = None,
) -> tuple[str, Strategy]:
    """The accelerator's name and the strategy, configured for the devices and nodes of this job
    (its cluster environment read here, unless a plugin gives one); warns (rank 0) of a precision
    alias and of more processes than CPU cores. ``plugins``: Lightning's plugin objects
    (:mod:`fullshard.plugins.resolve`)."""
    settings = None
    if plugins is not None:  # imported only when given: [Note: Lightning's module paths]
        from fullshard.plugins.resolve import resolve_plugins

        settings = resolve_plugins(plugins, precision)
        precision, sync_batchnorm = settings.precision, sync_batchnorm or settings.sync_batchnorm
    accelerator = resolve_accelerator(accelerator)
    environment = settings.environment if settings and settings.environment else select_cluster_environment()
    num_nodes = resolve_num_nodes(num_nodes, environment)
    device_list = resolve_devices(devices, accelerator, environment, num_nodes)
    configured = resolve_strategy(strategy, len(device_list) * num_nodes)
    configured.configure(
        devices=device_list,
        num_nodes=num_nodes,
        cluster_environment=environment,
        precision=precision,
        compile=compile_config,
    )
    configured.sync_batchnorm = sync_batchnorm
    if settings is not None and settings.async_save:
        from fullshard.plugins.resolve import apply_async_save

        apply_async_save(configured)
    set_global_rank(configured.global_rank)  # warnings before fit: rank 0 only
    if (note := alias_warning(precision)) is not None:
        rank_zero_warn(note, stacklevel=3)
    if (
        accelerator == "cpu"
        and configured.launcher is not None
        and not environment.creates_processes_externally  # this process starts the others
        and (note := more_processes_than_cores(len(device_list))) is not None
    ):
        rank_zero_warn(note, stacklevel=3)
    return accelerator, configured


_ACCELERATORS = ("auto", "cpu", "cuda", "gpu")
_OTHER_HARDWARE = ("tpu", "mps", "hpu", "ipu", "xla")  # Lightning's other accelerators


def resolve_accelerator(accelerator: str) -> str:
    if accelerator not in _ACCELERATORS:
        # 'tpu' is one letter from 'gpu', but means other hardware, not a typo
        hint = "" if str(accelerator).lower() in _OTHER_HARDWARE else did_you_mean(accelerator, _ACCELERATORS)
        raise MisconfigurationError(
            f"accelerator={accelerator!r} is not supported.{hint} "
            f"Use one of {', '.join(map(repr, _ACCELERATORS))}."
        )
    if accelerator == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if accelerator in ("cuda", "gpu"):
        if not torch.cuda.is_available():
            raise MisconfigurationError(
                f"accelerator={accelerator!r} was requested but torch sees no CUDA device "
                f"(torch {torch.__version__}). Use accelerator='cpu', or install a CUDA build of torch."
            )
        return "cuda"
    return "cpu"


def resolve_num_nodes(num_nodes: Any, env: ClusterEnvironment) -> int:
    """``num_nodes`` as an int; ``"auto"`` takes the number of nodes torchrun or SLURM started
    (1 otherwise), so that an elastic job (``torchrun --nnodes=1:4``) runs on however many joined."""
    if num_nodes == "auto":
        return env.num_nodes() or 1
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise MisconfigurationError(
            f"num_nodes={num_nodes!r} is invalid: use an int >= 1, or 'auto' for the number of nodes torchrun "
            "or SLURM started."
        )
    return num_nodes


def resolve_devices(
    devices: Any, accelerator: str, env: ClusterEnvironment, num_nodes: int
) -> list[torch.device]:
    """``Trainer(devices=)`` as this node's devices: ``"auto"``, a count, -1 (all GPUs), or a list
    of distinct GPU indices (also as a string, ``"0,1"``, as Lightning reads it). On CPU it is a
    count of processes: a list is refused, as Lightning refuses it (there are no CPU indices, and
    ``[0, 0]`` would start two processes on one "device")."""
    accepted = "'auto', an int > 0, -1 (all GPUs), or a list of distinct GPU indices"
    devices = _parse_string(devices, accepted)
    available = torch.cuda.device_count() if accelerator == "cuda" else None
    if devices == "auto":
        if env.creates_processes_externally and not isinstance(env, _local_environment_type()):
            devices = max(env.world_size() // num_nodes, 1)
        else:
            devices = available if accelerator == "cuda" else 1
    if devices == -1:
        if accelerator != "cuda":
            raise MisconfigurationError(
                "devices=-1 means 'all GPUs' and needs accelerator='cuda'; on CPU pass a count."
            )
        devices = available
    if isinstance(devices, bool) or not isinstance(devices, int | list | tuple):
        raise MisconfigurationTypeError(
            f"devices={devices!r} is not understood ({type(devices).__name__}); use {accepted}."
        )
    if isinstance(devices, int):
        if devices < 1:  # a TypeError, as Lightning's for it
            raise MisconfigurationTypeError(f"devices={devices} is invalid; use {accepted}.")
        indices = list(range(devices))
    elif accelerator != "cuda":
        raise MisconfigurationTypeError(
            f"devices={devices!r} is a list of device indices, which only GPUs have: on CPU, devices is the "
            f"number of processes, an int > 0. Pass devices={max(len(devices), 1)} to start "
            f"{max(len(devices), 1)} process(es), or accelerator='cuda' for GPUs."
        )
    else:
        indices = _gpu_indices(devices, accepted)
    if accelerator == "cuda":
        if available is not None and max(indices) >= available:
            raise MisconfigurationError(
                f"devices={devices!r} asks for GPU {max(indices)}, but only {available} GPU(s) are visible."
            )
        return [torch.device("cuda", i) for i in indices]
    return [torch.device("cpu")] * len(indices)


def _parse_string(devices: Any, accepted: str) -> Any:
    """``devices`` given as a string, read as Lightning reads it: ``"auto"``, ``"-1"``, a count
    (``"2"``) or comma-separated GPU indices (``"0,1"``, ``"1,"``)."""
    if not isinstance(devices, str) or devices == "auto":
        return devices
    try:
        if "," in devices:
            return [int(part) for part in devices.split(",") if part.strip()]
        return int(devices)
    except ValueError:
        raise MisconfigurationTypeError(f"devices={devices!r} is not understood; use {accepted}.") from None


def _gpu_indices(devices: list[Any] | tuple[Any, ...], accepted: str) -> list[int]:
    """A list of GPU indices: ints >= 0, each once (two processes cannot share one GPU)."""
    indices = list(devices)
    if not indices:
        raise MisconfigurationError(f"devices={devices!r} is invalid: it names no GPU; use {accepted}.")
    for index in indices:
        if isinstance(index, bool) or not isinstance(index, int):
            raise MisconfigurationTypeError(
                f"devices={devices!r} holds {index!r} ({type(index).__name__}); GPU indices are ints >= 0."
            )
        if index < 0:
            raise MisconfigurationError(
                f"devices={devices!r} holds {index}; GPU indices are ints >= 0 (devices=-1 alone means all GPUs)."
            )
    repeated = sorted({i for i in indices if indices.count(i) > 1})
    if repeated:
        raise MisconfigurationError(
            f"devices={devices!r} names GPU {', '.join(map(str, repeated))} more than once; each process needs a "
            f'GPU of its own (Lightning: "Device ID\'s (GPU) must be unique"). Pass distinct indices, e.g. '
            f"devices={sorted(set(indices))!r}."
        )
    return indices


def usable_cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def more_processes_than_cores(num_processes: int) -> str | None:
    """The warning for a CPU run that starts more processes on this machine than it has cores;
    None when each process can have a core of its own."""
    cores = usable_cpu_cores()
    if num_processes <= cores:
        return None
    return (
        f"devices={num_processes} starts {num_processes} CPU processes on this machine, but only {cores} CPU "
        f"core(s) are available to them. The processes share the cores, so each step takes longer than "
        f"with one process per core. Pass devices={cores} or fewer (devices <= CPU cores) unless you "
        "mean to test more ranks than the machine has cores."
    )


def configure_torch(deterministic: bool | str | None, benchmark: bool | None, device: torch.device) -> None:
    """Apply ``Trainer(deterministic=..., benchmark=...)`` in this process, which computes on ``device``."""
    if deterministic is not None:
        torch.use_deterministic_algorithms(bool(deterministic), warn_only=deterministic == "warn")
        if deterministic and device.type == "cuda":
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if benchmark is not None:
        torch.backends.cudnn.benchmark = benchmark


def _local_environment_type() -> type:
    from fullshard.launch import LocalEnvironment

    return LocalEnvironment
