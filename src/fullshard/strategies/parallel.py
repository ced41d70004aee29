"""Shared machinery of the multi-process strategies: ranks, process group, collectives, launch."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import time
import warnings
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.distributed_c10d import Store
from torch.optim import Optimizer
from typing_extensions import override

from fullshard.errors import MisconfigurationError, RankDivergenceError
from fullshard.launch import (
    ClusterEnvironment,
    Launcher,
    LocalEnvironment,
    SpawnLauncher,
    SubprocessScriptLauncher,
    stuck_ranks,
    wait_for_local_children,
)
from fullshard.launch.launchers import QUIET_START_VAR, end_job
from fullshard.launch.stuck_ranks import DEFAULT_STUCK_RANK_TIMEOUT, check_stuck_rank_timeout
from fullshard.seed import reset_seed
from fullshard.strategies.parallel_layout import ParallelLayout
from fullshard.strategies.strategy import ReduceOp, Strategy

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_TIMEOUT = timedelta(minutes=30)
DEFAULT_RANK_AGREEMENT_TIMEOUT = timedelta(seconds=30)
_EXIT_BARRIER_TIMEOUT = timedelta(seconds=30)
_EXIT_KEY = "fullshard/exit/arrived"
_STORE_TIMEOUT = timedelta(seconds=10)  # the watchdog's own store connection: no call waits longer
_BACKENDS = ("gloo", "nccl", "mpi", "ucc")
_START_METHODS = ("popen", "spawn", "fork", "forkserver")
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
    timeout keeps a rank whose peers already died from waiting forever. Rank 0 hosts the store
    and destroys the group only after the copies it started have exited.

    Even then, a gloo worker thread can still be dropping a finished collective when the
    interpreter finalizes, and abort the process; the copies SubprocessScriptLauncher starts
    therefore leave without finalizing: [Note: a launched copy leaves with os._exit] in
    fullshard.launch.rerun_main.
    """
    stuck_ranks.stop_watching()
    if not dist.is_available() or not dist.is_initialized():
        return
    if _failed or getattr(sys, "last_value", None) is not None:
        # This process failed (in a Trainer call, or in the user's code after it: an uncaught
        # exception): its peers are stuck elsewhere or gone, and meeting them would only delay
        # the exit that ends the job (see [Note: failures after fit]).
        return
    if not _all_ranks_leaving(_EXIT_BARRIER_TIMEOUT):
        return
    try:
        if dist.get_backend() == "gloo":
            dist.monitored_barrier(timeout=_EXIT_BARRIER_TIMEOUT)
        else:
            dist.barrier()
    except Exception as err:  # peers gone: nothing to agree on any more
        log.debug("barrier before destroy_process_group failed: %s", err)
    wait_for_local_children()  # rank 0 hosts the store: let the others leave first
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


def _all_ranks_leaving(timeout: timedelta) -> bool:
    """[Note: failures after fit]

    A rank whose program ended (returned, or raised) while a peer is still inside a collective
    (``save_checkpoint`` or ``validate`` after ``fit``, which this rank never called) must not
    wait for that peer in a collective of its own: gloo's barrier, even the monitored one, can
    wait on its send for the process group's timeout (30 minutes), and the peer waits for it in
    turn. A process that raised skips the barrier (its exit ends the job through the launcher,
    or torchrun); one that ended normally first counts its arrival in the store, which waits
    for nothing, and meets the others in the barrier only when every rank has arrived. If not
    all arrive within ``timeout``, it says so and leaves: the peer's collective then fails
    (gloo: "Connection closed by peer") instead of waiting out the timeout.
    """
    world_size = dist.get_world_size()
    if world_size == 1:
        return True
    try:
        store = _default_store()
        deadline = time.monotonic() + timeout.total_seconds()
        arrived = store.add(_EXIT_KEY, 1)
        pause = 0.005
        while arrived < world_size:
            if time.monotonic() >= deadline:
                print(
                    f"fullshard: rank {dist.get_rank()} reached the end of its program, but {world_size - arrived}"
                    f" of the {world_size} ranks did not within {timeout.total_seconds():g} s; they may be waiting in"
                    " a collective this rank never called (e.g. save_checkpoint or validate called on some ranks"
                    " only: every rank must call them). Leaving without the final barrier.",
                    file=sys.stderr,
                    flush=True,
                )
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
            arrived = store.add(_EXIT_KEY, 0)
    except Exception as err:  # the store's host (rank 0) is gone: nobody left to meet
        log.debug("counting the ranks that leave failed: %s", err)
        return False
    return True


def _end_quiet_start() -> None:
    """Drop the start-up filter a re-run copy of the script began with ([Note: warnings once])."""
    if os.environ.pop(QUIET_START_VAR, None) is None:  # popped: processes this one starts are not copies
        return
    entry = ("ignore", None, Warning, None, 0)
    if entry in warnings.filters:
        warnings.filters.remove(entry)  # type: ignore[attr-defined]  # a list at run time


class ParallelStrategy(Strategy):
    """Base of strategies with one process per device (DDP, FSDP).

    Args:
        process_group_backend: ``"gloo"`` (CPU), ``"nccl"`` (CUDA), ...; by default chosen from
            the device type.
        timeout: how long collectives wait for a peer before failing.
        start_method: ``"popen"`` re-runs the user's script once per extra process (the default;
            works from any script). The others start the processes with
            :mod:`torch.multiprocessing` from the calling process: ``"fork"`` as copies of it
            (notebooks, ``python -c``; one CPU thread per process; refused once CUDA is
            initialised), ``"spawn"``/``"forkserver"`` as fresh interpreters (the model and data
            must pickle, and their classes be importable from a module).
        state_dict_type: checkpoint format: ``"full"`` (one file) or ``"sharded"`` (a directory
            with a file per process, loadable at any world size).
        rank_agreement_timeout: how long a rank that skips a step or runs out of data waits for
            the others to do the same before raising
            :class:`~fullshard.errors.RankDivergenceError` (see :meth:`check_rank_agreement`).
        stuck_rank_timeout: how long a rank may go without beginning a batch (training,
            validation, test, predict) before the job ends, naming the stuck rank and showing its
            stack (5 minutes by default; None turns the check off). Time outside ``fit`` /
            ``validate`` / ... and checkpoint reads and writes do not count; see
            [Note: stuck ranks] in :mod:`fullshard.launch.stuck_ranks` and docs/launching.md.
    """

    one_process_per_device = True

    def __init__(
        self,
        *,
        process_group_backend: str | None = None,
        timeout: timedelta | None = DEFAULT_TIMEOUT,
        start_method: str = "popen",
        state_dict_type: str = "full",
        rank_agreement_timeout: timedelta = DEFAULT_RANK_AGREEMENT_TIMEOUT,
        stuck_rank_timeout: timedelta | None = DEFAULT_STUCK_RANK_TIMEOUT,
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
        if not isinstance(rank_agreement_timeout, timedelta) or rank_agreement_timeout <= timedelta(0):
            raise MisconfigurationError(
                f"rank_agreement_timeout must be a positive datetime.timedelta, got {rank_agreement_timeout!r}. "
                "For example: rank_agreement_timeout=datetime.timedelta(seconds=30)."
            )
        self._process_group_backend = process_group_backend
        self.timeout = timeout or DEFAULT_TIMEOUT
        self.start_method = start_method
        self.rank_agreement_timeout = rank_agreement_timeout
        self.stuck_rank_timeout = check_stuck_rank_timeout(stuck_rank_timeout)
        self._agreements: dict[tuple[str, str], int] = {}  # reports made so far, by (event, key)
        self._launcher: Launcher | None = None
        self._layout: ParallelLayout | None = None  # worked out by configure

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
        self._layout = self._make_layout()
        if self.start_method == "popen":
            self._launcher = SubprocessScriptLauncher(env, self.num_processes, self.num_nodes)
        else:
            self._launcher = SpawnLauncher(env, self.num_processes, self.num_nodes, self.start_method)

    def _make_layout(self) -> ParallelLayout:
        """This job's :class:`ParallelLayout`, its sizes checked against the job's (once, by
        :meth:`configure`). Here every process is a replica of its own (DDP)."""
        return ParallelLayout(replicas=self.world_size, shards=1, mesh_dims=("replicate",))

    @property
    def layout(self) -> ParallelLayout:
        """How the job's processes are laid out (see [Note: one parallel layout] in
        fullshard.strategies.parallel_layout): known once the host configured the strategy."""
        if self._layout is None:
            raise RuntimeError(
                f"{type(self).__name__}'s layout is known once a Trainer has configured it (Trainer(strategy=...))."
            )
        return self._layout

    @property
    @override
    def data_parallel_size(self) -> int:
        return self.layout.data_parallel_size

    @property
    @override
    def data_parallel_rank(self) -> int:
        return self.layout.data_parallel_rank(self.global_rank)

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
        reset_seed()  # as Lightning's distributed strategies: see fullshard.seed.reset_seed
        _end_quiet_start()
        env = self._environment()
        if self.root_device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
            # N processes on one machine each defaulting to all cores would oversubscribe it.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // self.num_processes))
        self._set_world_ranks()  # spawned workers learn their rank only now, from the launcher's variables
        if not dist.is_initialized():
            os.environ.setdefault("MASTER_ADDR", env.main_address)
            os.environ.setdefault("MASTER_PORT", str(env.main_port))
            dist.init_process_group(
                self.process_group_backend,
                rank=self.global_rank,
                world_size=self.world_size,
                timeout=self.timeout,
            )
            atexit.register(_destroy_process_group_at_exit)
        self._watch_for_stuck_ranks()

    def _watch_for_stuck_ranks(self) -> None:
        """Start this process's stuck-rank watchdog ([Note: stuck ranks] in
        fullshard.launch.stuck_ranks), or stop it when this strategy turns the check off."""
        if self.stuck_rank_timeout is None or self.world_size == 1:
            stuck_ranks.stop_watching()
            return
        # A connection of its own (see the note); torch 2.13's stubs lack Store.clone.
        store: Store = _default_store().clone()  # type: ignore[attr-defined]
        store.set_timeout(_STORE_TIMEOUT)
        stuck_ranks.watch(
            rank=self.global_rank,
            world_size=self.world_size,
            timeout=self.stuck_rank_timeout,
            store=store,
            untimed_first_batch=self.compile is not None,
            end_process=end_job,
        )

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
        return _all_reduce(tensor, op, None, self.world_size)

    @override
    def all_reduce_data_parallel(self, tensor: torch.Tensor, op: ReduceOp = "mean") -> torch.Tensor:
        size = self.data_parallel_size
        if size == self.world_size:
            return self.all_reduce(tensor, op)
        if not dist.is_initialized():
            return tensor
        mesh = self.device_mesh
        if mesh is None or "data_parallel" not in (mesh.mesh_dim_names or ()):
            raise RuntimeError(
                f"{type(self).__name__} has {size} data replicas among {self.world_size} processes but no device "
                "mesh with a 'data_parallel' dimension to reduce over."
            )
        return _all_reduce(tensor, op, mesh.get_group("data_parallel"), size)

    @override
    def all_gather_object(self, obj: T) -> list[T]:
        if not dist.is_initialized() or self.world_size == 1:
            return [obj]
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, obj)
        return gathered

    @override
    def gather_object(self, obj: T) -> list[T] | None:
        if not dist.is_initialized() or self.world_size == 1:
            return [obj]
        gathered: list[Any] | None = [None] * self.world_size if self.global_rank == 0 else None
        dist.gather_object(obj, gathered, dst=0)
        return gathered

    @override
    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        if not dist.is_initialized() or self.world_size == 1:
            return decision
        votes = self.all_reduce(torch.tensor(int(decision), device=self.root_device), op="sum")
        return bool(votes.item() == self.world_size) if all else bool(votes.item() > 0)

    # ---------------------------------------------------------------------- rank agreement
    @override
    def key_value_store(self) -> Any:
        if self.world_size == 1 or not dist.is_initialized():
            return None
        return _default_store()

    @override
    def check_rank_agreement(self, event: str, key: str, detail: str) -> None:
        """Wait (at most :attr:`rank_agreement_timeout`) until every rank has reported ``event``
        at ``key``; raise :class:`~fullshard.errors.RankDivergenceError` if some never do.

        [Note: rank agreement]
        A rank that skips a step (or runs out of data) while the others go on leaves them in the
        step's collectives, waiting for it until the process group's timeout (30 minutes by
        default). Only the rank that deviates knows it does, so it is the one that checks: each
        reporting rank adds one to a counter in the process group's key-value store, under a key
        made of the event, its key and how often this rank reported that pair before (a second
        ``fit`` meets the same keys again), and polls the counter. When every rank reported, all
        go on; a rank still waiting at the deadline raises, naming who reported and who did not,
        and the launcher ends the rest of the job (see [Note: a failure ends the job]). The
        store is not a collective, so a peer blocked in one cannot block the check, and steps
        without a report cost nothing.
        """
        if self.world_size == 1 or not dist.is_initialized():
            return
        seen = self._agreements.get((event, key), 0)
        self._agreements[(event, key)] = seen + 1
        prefix = f"fullshard/agreement/{event}/{key}/{seen}"
        rank_keys = [f"{prefix}/rank{rank}" for rank in range(self.world_size)]
        store = _default_store()
        store.set(rank_keys[self.global_rank], detail)
        deadline = time.monotonic() + self.rank_agreement_timeout.total_seconds()
        arrived = store.add(f"{prefix}/count", 1)
        pause = 0.005
        while arrived < self.world_size:
            if time.monotonic() >= deadline:
                reported = [rank for rank, name in enumerate(rank_keys) if store.check([name])]
                timeout = self.rank_agreement_timeout
                raise _divergence_error(event, key, detail, reported, self.world_size, timeout)
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
            arrived = store.add(f"{prefix}/count", 0)
        if store.add(f"{prefix}/done", 1) == self.world_size:  # the last rank to leave cleans up
            for name in [*rank_keys, f"{prefix}/count", f"{prefix}/done"]:
                with contextlib.suppress(Exception):
                    store.delete_key(name)


def refuse_optimizer_outside(model: nn.Module, optimizer: Optimizer, model_kind: str, built: str) -> None:
    """Raise if ``optimizer`` holds none of ``model``'s parameters (it was built from the module
    before the strategy replaced them); ``model_kind`` and ``built`` (when the Trainer calls
    ``configure_optimizers``) complete the message."""
    managed = {id(p) for p in model.parameters()}
    if not any(id(p) in managed for group in optimizer.param_groups for p in group["params"]):
        raise MisconfigurationError(
            f"The {type(optimizer).__name__} references no parameter of the {model_kind} model, so it would train "
            f"nothing. Create optimizers in configure_optimizers() from self.parameters(): the Trainer calls it {built}."
        )


def _all_reduce(tensor: torch.Tensor, op: ReduceOp, group: Any, size: int) -> torch.Tensor:
    """``tensor`` reduced by ``op`` over ``group`` (None: every process) of ``size`` processes."""
    if op not in _REDUCE_OPS:
        raise ValueError(f"Unknown reduce op {op!r}; use one of {', '.join(map(repr, _REDUCE_OPS))}.")
    out = tensor.detach().clone()
    if op == "mean" and not torch.is_floating_point(out):
        out = out.float()
    dist.all_reduce(out, op=_REDUCE_OPS[op], group=group)
    if op == "mean":
        out /= size
    return out


def _default_store() -> Store:
    """The key-value store the default process group was initialised with.

    torch has no public accessor for it (``init_process_group`` builds it from the init method
    and keeps it to itself); this private one has been stable for years. A store of our own would
    need its own port and could not follow torchrun's agent store, so it is used here, and only here.
    """
    from torch.distributed.distributed_c10d import _get_default_store

    return _get_default_store()


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(map(str, ranks))


def _divergence_error(
    event: str, key: str, detail: str, reported: list[int], world_size: int, timeout: timedelta
) -> RankDivergenceError:
    missing = [r for r in range(world_size) if r not in reported]
    waited = f"{timeout.total_seconds():g} s"
    did, did_not = _ranks(reported), _ranks(missing)
    if event == "skip":
        return RankDivergenceError(
            f"{did.capitalize()} skipped a training step ({detail}), but {did_not} did not within {waited}:"
            f" {did_not} went on into the step's collectives (the gradient reduction), where {did_not} would"
            " wait for the skipping ranks until the process group's timeout. Under a multi-process strategy"
            " every rank must skip the same steps. Return a zero loss that keeps the graph instead of None"
            " (e.g. `return loss * 0`), so that every rank runs backward, or decide to skip on every rank at"
            " once (e.g. with `self.trainer.strategy.reduce_boolean_decision(skip, all=False)`)."
        )
    if event == "end_of_data":
        return RankDivergenceError(
            f"{did.capitalize()} ran out of training data ({detail}), but {did_not} did not within {waited}:"
            f" {did_not} still had batches and went on into the next step's collectives, where {did_not}"
            " would wait for the others until the process group's timeout. Every rank must get the same number"
            " of batches per epoch: make every rank's data the same length (an IterableDataset must yield as"
            " many batches on every rank: drop or pad the remainder), or set limit_train_batches to a count"
            " every rank reaches."
        )
    return RankDivergenceError(
        f"{did.capitalize()} reported {event!r} at {key} ({detail}), but {did_not} did not within {waited}."
        " Every rank must take the same path here; make the ranks agree."
    )
