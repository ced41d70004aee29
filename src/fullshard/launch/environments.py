"""Cluster environments: where a process learns its ranks, the world size and the rendezvous address.

A cluster environment only reads what the surrounding system provides (environment variables
set by torchrun, SLURM, or fullshard's own launcher); it never starts processes. The strategy
asks it for ranks and for the main address/port, and passes them to
``torch.distributed.init_process_group``.
"""

from __future__ import annotations

import itertools
import os
import re
import socket
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterator

from typing_extensions import override

from fullshard.errors import MisconfigurationError

__all__ = [
    "ClusterEnvironment",
    "LocalEnvironment",
    "SLURMEnvironment",
    "TorchElasticEnvironment",
    "expand_slurm_hostlist",
    "select_cluster_environment",
]


class ClusterEnvironment(ABC):
    """Where a process learns its ranks, the world size and the rendezvous address."""

    @property
    @abstractmethod
    def creates_processes_externally(self) -> bool:
        """True when something else (torchrun, SLURM, fullshard's launcher in a parent process)
        already started one process per device, so the Trainer must not start more."""

    @property
    @abstractmethod
    def main_address(self) -> str:
        """Host name or IP address of the process with global rank 0."""

    @property
    @abstractmethod
    def main_port(self) -> int:
        """Port on the main address where the processes meet to form the process group."""

    @staticmethod
    @abstractmethod
    def detect() -> bool:
        """Whether this environment is the one the current process runs in."""

    @abstractmethod
    def world_size(self) -> int:
        """Total number of processes in the job."""

    @abstractmethod
    def set_world_size(self, size: int) -> None:
        """Record the world size the strategy computed (environments that know it ignore this)."""

    @abstractmethod
    def global_rank(self) -> int:
        """Rank of this process among all processes of the job."""

    @abstractmethod
    def set_global_rank(self, rank: int) -> None:
        """Record the global rank the strategy computed (environments that know it ignore this)."""

    @abstractmethod
    def local_rank(self) -> int:
        """Rank of this process among the processes on its node."""

    @abstractmethod
    def node_rank(self) -> int:
        """Rank of this process's node among the nodes of the job."""

    @abstractmethod
    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Raise :class:`MisconfigurationError` when the Trainer's ``devices``/``num_nodes``
        disagree with what the environment started."""

    def num_nodes(self) -> int | None:
        """How many nodes the surrounding system started, for ``Trainer(num_nodes="auto")``; None
        when it does not say (then the job has one node)."""
        return None

    def teardown(self) -> None:  # noqa: B027 (a no-op is the right default)
        """Undo what this object changed in the process (by default nothing)."""


def _env_int(name: str, default: int | None = None) -> int:
    """Read environment variable ``name`` as an integer; ``default`` when it is unset."""
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise MisconfigurationError(
                f"The environment variable {name} is not set; it must hold an integer."
            )
        return default
    try:
        return int(value)
    except ValueError:
        raise MisconfigurationError(
            f"The environment variable {name}={value!r} is not an integer."
            " Set it to a whole number or unset it."
        ) from None


def _find_free_port() -> int:
    """Ask the OS for a TCP port that is free right now on this machine."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        port: int = sock.getsockname()[1]
        return port


def _warn_ignored(what: str, given: int, actual: int, source: str) -> None:
    if given != actual:
        warnings.warn(
            f"Ignoring {what}={given}: {source} says {actual}, and that value is used.",
            UserWarning,
            stacklevel=3,
        )


class LocalEnvironment(ClusterEnvironment):
    """Processes on this machine (or on nodes prepared by hand), started by the Trainer itself.

    Ranks come from ``LOCAL_RANK`` and ``NODE_RANK`` (both default 0). The world size and the
    global rank are computed by the strategy and recorded with the setters. When no
    ``MASTER_PORT`` is set, a free port is chosen once and written to ``os.environ`` so that
    processes started afterwards inherit it; :meth:`teardown` removes it again unless this
    process belongs to a launched job (``LOCAL_RANK`` set), whose later runs need the same port.
    """

    def __init__(self) -> None:
        self._world_size = 1
        self._global_rank = 0
        self._chosen_port: int | None = None

    @property
    @override
    def creates_processes_externally(self) -> bool:
        return "LOCAL_RANK" in os.environ

    @property
    @override
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    @override
    def main_port(self) -> int:
        if "MASTER_PORT" in os.environ:
            return _env_int("MASTER_PORT")
        if self._chosen_port is None:
            self._chosen_port = _find_free_port()
        os.environ["MASTER_PORT"] = str(self._chosen_port)
        return self._chosen_port

    @staticmethod
    @override
    def detect() -> bool:
        return True

    @override
    def world_size(self) -> int:
        return self._world_size

    @override
    def set_world_size(self, size: int) -> None:
        self._world_size = size

    @override
    def global_rank(self) -> int:
        return self._global_rank

    @override
    def set_global_rank(self, rank: int) -> None:
        self._global_rank = rank

    @override
    def local_rank(self) -> int:
        return _env_int("LOCAL_RANK", 0)

    @override
    def node_rank(self) -> int:
        return _env_int("NODE_RANK", 0)

    @override
    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        if num_nodes > 1:
            missing = [name for name in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK") if name not in os.environ]
            if missing:
                raise MisconfigurationError(
                    f"Trainer(num_nodes={num_nodes}) without torchrun or SLURM needs MASTER_ADDR, MASTER_PORT"
                    f" and NODE_RANK set on every node, but {', '.join(missing)} is not set. Set them (the"
                    " same address and port everywhere, NODE_RANK=0..num_nodes-1), or start the job with"
                    " torchrun or srun."
                )
        node_rank = self.node_rank()
        if node_rank >= num_nodes:
            raise MisconfigurationError(
                f"NODE_RANK={node_rank} but Trainer(num_nodes={num_nodes}) allows node ranks"
                f" 0..{num_nodes - 1}. Fix NODE_RANK or num_nodes."
            )
        if not self.creates_processes_externally:
            return
        local_rank = self.local_rank()
        if local_rank >= num_devices:
            raise MisconfigurationError(
                f"LOCAL_RANK={local_rank} but Trainer(devices={num_devices}) allows local ranks"
                f" 0..{num_devices - 1}. Unset LOCAL_RANK, or pass devices={local_rank + 1} or more."
            )
        if "WORLD_SIZE" in os.environ:
            world_size = _env_int("WORLD_SIZE")
            if world_size != num_devices * num_nodes:
                raise MisconfigurationError(
                    f"WORLD_SIZE={world_size} but Trainer(devices={num_devices}, num_nodes={num_nodes})"
                    f" needs {num_devices * num_nodes} processes. Give every Trainer in the script the same"
                    " devices and num_nodes, or unset WORLD_SIZE."
                )

    @override
    def teardown(self) -> None:
        port = self._chosen_port
        if port is None or "LOCAL_RANK" in os.environ:
            return
        if os.environ.get("MASTER_PORT") == str(port):
            del os.environ["MASTER_PORT"]


class TorchElasticEnvironment(ClusterEnvironment):
    """Processes started by ``torchrun`` (torch.distributed.elastic): everything comes from its
    environment variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``GROUP_RANK``, ...)."""

    @property
    @override
    def creates_processes_externally(self) -> bool:
        return True

    @property
    @override
    def main_address(self) -> str:
        return os.environ["MASTER_ADDR"]

    @property
    @override
    def main_port(self) -> int:
        return _env_int("MASTER_PORT")

    @staticmethod
    @override
    def detect() -> bool:
        required = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
        has_run = "TORCHELASTIC_RUN_ID" in os.environ or "GROUP_RANK" in os.environ
        return has_run and all(name in os.environ for name in required)

    @override
    def world_size(self) -> int:
        return _env_int("WORLD_SIZE")

    @override
    def set_world_size(self, size: int) -> None:
        _warn_ignored("world_size", size, self.world_size(), "torchrun (WORLD_SIZE)")

    @override
    def global_rank(self) -> int:
        return _env_int("RANK")

    @override
    def set_global_rank(self, rank: int) -> None:
        _warn_ignored("global_rank", rank, self.global_rank(), "torchrun (RANK)")

    @override
    def local_rank(self) -> int:
        return _env_int("LOCAL_RANK")

    @override
    def node_rank(self) -> int:
        return _env_int("GROUP_RANK", 0)

    @override
    def num_nodes(self) -> int:
        """``GROUP_WORLD_SIZE``: the nodes (agents) of this rendezvous round, which under
        ``--nnodes=MIN:MAX`` can change from one restart to the next."""
        if "GROUP_WORLD_SIZE" in os.environ:
            return _env_int("GROUP_WORLD_SIZE")
        return max(self.world_size() // _env_int("LOCAL_WORLD_SIZE", self.world_size()), 1)

    @override
    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        _check_restartable()
        world_size = self.world_size()
        local_world_size = _env_int("LOCAL_WORLD_SIZE", num_devices)
        if world_size == num_devices * num_nodes and local_world_size == num_devices:
            return
        raise MisconfigurationError(
            f"torchrun started {local_world_size} processes per node and {world_size} in total"
            f" (LOCAL_WORLD_SIZE={local_world_size}, WORLD_SIZE={world_size}), but the Trainer was given"
            f" devices={num_devices}, num_nodes={num_nodes}. Pass devices={local_world_size},"
            f" num_nodes={max(world_size // max(local_world_size, 1), 1)}, or start torchrun with"
            f" --nproc-per-node={num_devices} --nnodes={num_nodes}."
        )


# [Note: torchrun restarts and the shared store]
# torchrun's elastic agent hosts the TCPStore its workers' process group meets in
# (TORCHELASTIC_USE_AGENT_STORE=True, https://github.com/pytorch/pytorch/pull/128096) and keeps
# that store across restarts. The keys a process group writes there are the same in every
# attempt, so a restarted worker can read a peer's address from the attempt before and fail with
# "Gloo connectFullMesh failed ... Connection refused" (NCCL fails alike:
# https://github.com/pytorch/pytorch/issues/135712). On torch 2.13 with gloo, 2 of 3 restarts we
# tried failed so. The workers cannot tell the attempts apart by themselves:
# TORCHELASTIC_RESTART_COUNT is counted by each agent and can differ between nodes. With
# TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in torchrun's environment, the c10d rendezvous (also behind
# --standalone) has rank 0 of each attempt host a fresh store on a fresh port, and restarts
# re-form the group cleanly. The static rendezvous (torchrun's default when given --master-addr /
# --master-port) always shares its store: restarts need --rdzv-backend=c10d.
_SHARED_STORE_OFF = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def _check_restartable() -> None:
    """Refuse a torchrun job whose restarted workers would meet in the store of the attempt
    before: [Note: torchrun restarts and the shared store]."""
    max_restarts = _env_int("TORCHELASTIC_MAX_RESTARTS", 0)
    if max_restarts == 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return
    raise MisconfigurationError(
        f"torchrun was started with --max-restarts={max_restarts} and shares its TCPStore with the workers"
        " (TORCHELASTIC_USE_AGENT_STORE=True): restarted workers can read the addresses of the attempt"
        " before and fail to form the process group (https://github.com/pytorch/pytorch/issues/135712)."
        f" Set {_SHARED_STORE_OFF}=1 for torchrun and use the c10d rendezvous, e.g."
        f" `{_SHARED_STORE_OFF}=1 torchrun --standalone --max-restarts={max_restarts} ...` on one machine or"
        " `--rdzv-backend=c10d --rdzv-endpoint=HOST:PORT` on several (the static rendezvous always shares"
        " its store); or pass --max-restarts=0. See docs/launching.md, 'Elastic restarts with torchrun'."
    )


# SLURM gives no rendezvous port, and every process of a job must compute the same one
# without talking to the others, so it is derived from the job id. The range 10000..29999
# stays below Linux's ephemeral ports (32768 and up), where the OS hands out ports to
# outgoing connections; two jobs sharing a node collide only if their ids differ by a
# multiple of 20000. Set MASTER_PORT to choose the port yourself.
_SLURM_PORT_BASE = 10000
_SLURM_PORT_SPAN = 20000


class SLURMEnvironment(ClusterEnvironment):
    """Processes started by ``srun``, one per task.

    Ranks come from ``SLURM_PROCID``, ``SLURM_LOCALID`` and ``SLURM_NODEID``; the world size
    from ``SLURM_NTASKS``. The main address is ``MASTER_ADDR`` if set, else the first host of
    ``SLURM_NODELIST``; the main port is ``MASTER_PORT`` if set, else ``10000 + SLURM_JOB_ID %
    20000``.
    """

    @property
    @override
    def creates_processes_externally(self) -> bool:
        return True

    @property
    @override
    def main_address(self) -> str:
        if "MASTER_ADDR" in os.environ:
            return os.environ["MASTER_ADDR"]
        nodelist = os.environ.get("SLURM_NODELIST") or os.environ.get("SLURM_JOB_NODELIST")
        if not nodelist:
            raise MisconfigurationError(
                "Neither SLURM_NODELIST nor SLURM_JOB_NODELIST is set, so the main address is unknown."
                " Set MASTER_ADDR to the host of rank 0."
            )
        return next(_iter_hostlist(nodelist))

    @property
    @override
    def main_port(self) -> int:
        if "MASTER_PORT" in os.environ:
            return _env_int("MASTER_PORT")
        return _SLURM_PORT_BASE + _env_int("SLURM_JOB_ID") % _SLURM_PORT_SPAN

    @staticmethod
    @override
    def detect() -> bool:
        # Inside `srun --pty bash` or `salloc` (job name "bash"/"interactive") the user starts
        # Python by hand, so SLURM did not start one process per device.
        return "SLURM_NTASKS" in os.environ and os.environ.get("SLURM_JOB_NAME") not in (
            "bash",
            "interactive",
        )

    @override
    def world_size(self) -> int:
        return _env_int("SLURM_NTASKS")

    @override
    def set_world_size(self, size: int) -> None:
        _warn_ignored("world_size", size, self.world_size(), "SLURM (SLURM_NTASKS)")

    @override
    def global_rank(self) -> int:
        return _env_int("SLURM_PROCID")

    @override
    def set_global_rank(self, rank: int) -> None:
        _warn_ignored("global_rank", rank, self.global_rank(), "SLURM (SLURM_PROCID)")

    @override
    def local_rank(self) -> int:
        return _env_int("SLURM_LOCALID")

    @override
    def node_rank(self) -> int:
        return _env_int("SLURM_NODEID")

    @override
    def num_nodes(self) -> int | None:
        for name in ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"):
            if name in os.environ:
                return _env_int(name)
        return None

    @override
    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        ntasks = self.world_size()
        nnodes = _env_int("SLURM_NNODES", num_nodes)
        if ntasks == num_devices * num_nodes and nnodes == num_nodes:
            return
        raise MisconfigurationError(
            f"SLURM started {ntasks} tasks on {nnodes} nodes (SLURM_NTASKS={ntasks}, SLURM_NNODES={nnodes}),"
            f" but the Trainer was given devices={num_devices}, num_nodes={num_nodes}, which needs"
            f" {num_devices * num_nodes} tasks on {num_nodes} nodes. Submit with"
            f" `#SBATCH --nodes={num_nodes}` and `#SBATCH --ntasks-per-node={num_devices}`, or change"
            " devices/num_nodes to match."
        )


def expand_slurm_hostlist(hostlist: str) -> list[str]:
    """Expand a SLURM compressed host list, e.g. ``"node[001-003,007],gpu2"`` into
    ``["node001", "node002", "node003", "node007", "gpu2"]``.

    Ranges keep the zero padding of their lower bound, and a name with several bracket groups
    (``"rack[1-2]-n[1-2]"``) expands to every combination, in order.
    """
    return list(_iter_hostlist(hostlist))


def _iter_hostlist(hostlist: str) -> Iterator[str]:
    """Yield the hosts of a compressed host list lazily, so taking the first one is cheap."""
    patterns = _split_top_level(hostlist)
    if not patterns:
        raise MisconfigurationError(f"The SLURM host list {hostlist!r} names no host.")
    for pattern in patterns:
        parts = _parse_host_pattern(pattern, hostlist)
        for combination in itertools.product(*parts):
            yield "".join(combination)


def _split_top_level(hostlist: str) -> list[str]:
    """Split at the commas that are outside brackets, dropping empty pieces."""
    pieces: list[str] = []
    start = 0
    depth = 0
    for i, char in enumerate(hostlist):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            pieces.append(hostlist[start:i])
            start = i + 1
        if depth not in (0, 1):
            raise MisconfigurationError(
                f"The SLURM host list {hostlist!r} has unbalanced or nested brackets."
            )
    if depth != 0:
        raise MisconfigurationError(f"The SLURM host list {hostlist!r} has an unclosed '['.")
    pieces.append(hostlist[start:])
    return [piece.strip() for piece in pieces if piece.strip()]


def _parse_host_pattern(pattern: str, hostlist: str) -> list[list[str]]:
    """Turn ``"n[1-2]x"`` into ``[["n"], ["1", "2"], ["x"]]``: the choices for each part."""
    parts: list[list[str]] = []
    rest = pattern
    while rest:
        open_at = rest.find("[")
        if open_at == -1:
            parts.append([rest])
            break
        close_at = rest.index("]", open_at)  # balanced: checked by _split_top_level
        if open_at > 0:
            parts.append([rest[:open_at]])
        parts.append(_expand_ranges(rest[open_at + 1 : close_at], hostlist))
        rest = rest[close_at + 1 :]
    return parts


_RANGE_ITEM = re.compile(r"(\d+)(?:-(\d+))?", re.ASCII)


def _expand_ranges(spec: str, hostlist: str) -> list[str]:
    """Expand the inside of one bracket group, e.g. ``"001-003,7"``."""
    values: list[str] = []
    for item in spec.split(","):
        match = _RANGE_ITEM.fullmatch(item.strip())
        if match is None:
            raise MisconfigurationError(
                f"The SLURM host list {hostlist!r} has {item!r} in brackets; expected a number or a range"
                " like '001-004'."
            )
        low, high = match.group(1), match.group(2)
        if high is None:
            values.append(low)
        elif int(high) < int(low):
            raise MisconfigurationError(
                f"The SLURM host list {hostlist!r} has the descending range {item!r}."
            )
        else:
            values.extend(str(number).zfill(len(low)) for number in range(int(low), int(high) + 1))
    return values


def select_cluster_environment() -> ClusterEnvironment:
    """The environment this process runs in: torchrun first, then SLURM, else local."""
    if TorchElasticEnvironment.detect():
        return TorchElasticEnvironment()
    if SLURMEnvironment.detect():
        return SLURMEnvironment()
    return LocalEnvironment()
