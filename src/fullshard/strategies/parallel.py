"""Shared machinery of the multi-process strategies: ranks, process group, collectives, launch."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from typing_extensions import override

from fullshard.errors import MisconfigurationError
from fullshard.launch import (
    ClusterEnvironment,
    Launcher,
    LocalEnvironment,
    SpawnLauncher,
    SubprocessScriptLauncher,
    wait_for_local_children,
)
from fullshard.strategies.strategy import ReduceOp, Strategy

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_TIMEOUT = timedelta(minutes=30)
_BACKENDS = ("gloo", "nccl", "mpi", "ucc")
_START_METHODS = ("popen", "spawn", "forkserver")
_REDUCE_OPS = {
    "sum": dist.ReduceOp.SUM,
    "mean": dist.ReduceOp.SUM,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
}


_failed = False


def _destroy_process_group_at_exit() -> None:
    """[Note: process group teardown]

    Ranks that leave ``destroy_process_group`` out of step can abort on gloo, so every rank
    meets at a barrier first. The process group stays alive after ``fit`` (users call
    ``save_checkpoint`` afterwards), so this runs at interpreter exit. A monitored barrier with a
    timeout keeps a rank whose peers already died from waiting forever.
    """
    if not dist.is_available() or not dist.is_initialized():
        return
    if _failed:  # peers are stuck elsewhere or gone: meeting them would only delay the exit
        return
    try:
        if dist.get_backend() == "gloo":
            dist.monitored_barrier(timeout=timedelta(seconds=30))
        else:
            dist.barrier()
    except Exception as err:  # peers gone: nothing to agree on any more
        log.debug("barrier before destroy_process_group failed: %s", err)
    wait_for_local_children()  # rank 0 hosts the store: let the others leave first
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


class ParallelStrategy(Strategy):
    """Base of strategies with one process per device (DDP, FSDP).

    Args:
        process_group_backend: ``"gloo"`` (CPU), ``"nccl"`` (CUDA), ...; by default chosen from
            the device type.
        timeout: how long collectives wait for a peer before failing.
        start_method: ``"popen"`` re-runs the user's script once per extra process (the default;
            works from any script), ``"spawn"``/``"forkserver"`` start workers with
            :mod:`torch.multiprocessing` (for notebooks; the model must be picklable).
        state_dict_type: checkpoint format: ``"full"`` (one file) or ``"sharded"`` (a directory
            with a file per process, loadable at any world size).
    """

    def __init__(
        self,
        *,
        process_group_backend: str | None = None,
        timeout: timedelta | None = DEFAULT_TIMEOUT,
        start_method: str = "popen",
        state_dict_type: str = "full",
    ) -> None:
        super().__init__(state_dict_type=state_dict_type)
        if process_group_backend is not None and process_group_backend not in _BACKENDS:
            raise MisconfigurationError(
                f"process_group_backend={process_group_backend!r} is not a torch.distributed backend. "
                f"Use one of {', '.join(map(repr, _BACKENDS))}, or leave it unset to choose by device "
                "('gloo' on CPU, 'nccl' on CUDA)."
            )
        if start_method not in _START_METHODS:
            raise MisconfigurationError(
                f"start_method={start_method!r} is not supported. Use one of "
                f"{', '.join(map(repr, _START_METHODS))}."
            )
        if timeout is not None and not isinstance(timeout, timedelta):
            raise MisconfigurationError(
                f"timeout must be a datetime.timedelta, got {type(timeout).__name__} ({timeout!r}). "
                "For example: timeout=datetime.timedelta(minutes=10)."
            )
        self._process_group_backend = process_group_backend
        self.timeout = timeout or DEFAULT_TIMEOUT
        self.start_method = start_method
        self._launcher: Launcher | None = None

    @property
    def process_group_backend(self) -> str:
        """The backend the process group uses."""
        if self._process_group_backend is not None:
            return self._process_group_backend
        return "nccl" if self.devices[0].type == "cuda" else "gloo"

    @property
    def num_processes(self) -> int:
        """Processes on this node: one per device."""
        return len(self.devices)

    def _environment(self) -> ClusterEnvironment:
        if self.cluster_environment is None:
            raise RuntimeError(
                f"{type(self).__name__} was not configured by a host (no cluster environment)."
            )
        return self.cluster_environment

    @override
    def configure(self, **kwargs: Any) -> None:
        super().configure(**kwargs)
        env = self._environment()
        env.validate_settings(num_devices=self.num_processes, num_nodes=self.num_nodes)
        self._set_world_ranks()
        if self.start_method == "popen":
            self._launcher = SubprocessScriptLauncher(env, self.num_processes, self.num_nodes)
        else:
            self._launcher = SpawnLauncher(env, self.num_processes, self.num_nodes, self.start_method)

    def _set_world_ranks(self) -> None:
        """With the local environment, ranks follow from devices, nodes and LOCAL_RANK / NODE_RANK."""
        env = self._environment()
        if isinstance(env, LocalEnvironment):
            env.set_world_size(self.num_processes * self.num_nodes)
            env.set_global_rank(env.node_rank() * self.num_processes + env.local_rank())

    @property
    @override
    def launcher(self) -> Launcher | None:
        return self._launcher

    @property
    @override
    def global_rank(self) -> int:
        return self._environment().global_rank() if self.cluster_environment else 0

    @property
    @override
    def local_rank(self) -> int:
        return self._environment().local_rank() if self.cluster_environment else 0

    @property
    @override
    def node_rank(self) -> int:
        return self._environment().node_rank() if self.cluster_environment else 0

    @property
    @override
    def world_size(self) -> int:
        return self._environment().world_size() if self.cluster_environment else 1

    @override
    def setup_environment(self) -> None:
        super().setup_environment()
        env = self._environment()
        if self.root_device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
            # N processes on one machine each defaulting to all cores would oversubscribe it.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // self.num_processes))
        self._set_world_ranks()  # spawned workers learn their rank only now, from the launcher's variables
        if dist.is_initialized():
            return
        os.environ.setdefault("MASTER_ADDR", env.main_address)
        os.environ.setdefault("MASTER_PORT", str(env.main_port))
        dist.init_process_group(
            self.process_group_backend,
            rank=self.global_rank,
            world_size=self.world_size,
            timeout=self.timeout,
        )
        atexit.register(_destroy_process_group_at_exit)

    @override
    def on_exception(self, exception: BaseException) -> None:
        global _failed
        _failed = True

    # ---------------------------------------------------------------------------- collectives
    @override
    def barrier(self, name: str | None = None) -> None:
        if dist.is_initialized() and self.world_size > 1:
            dist.barrier()

    @override
    def broadcast(self, obj: T, src: int = 0) -> T:
        if not dist.is_initialized() or self.world_size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    @override
    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp = "mean") -> torch.Tensor:
        if not dist.is_initialized() or self.world_size == 1:
            return tensor
        if op not in _REDUCE_OPS:
            raise ValueError(f"Unknown reduce op {op!r}; use one of {', '.join(map(repr, _REDUCE_OPS))}.")
        out = tensor.detach().clone()
        if op == "mean" and not torch.is_floating_point(out):
            out = out.float()
        dist.all_reduce(out, op=_REDUCE_OPS[op])
        if op == "mean":
            out /= self.world_size
        return out

    @override
    def all_gather_object(self, obj: T) -> list[T]:
        if not dist.is_initialized() or self.world_size == 1:
            return [obj]
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, obj)
        return gathered

    @override
    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        if not dist.is_initialized() or self.world_size == 1:
            return decision
        votes = self.all_reduce(torch.tensor(int(decision), device=self.root_device), op="sum")
        return bool(votes.item() == self.world_size) if all else bool(votes.item() > 0)
