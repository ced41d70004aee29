"""What the planner chooses between, and what it knows of the target devices.

A :class:`Candidate` is one configuration of an FSDP strategy (engine, sharding, wrapped classes,
activation checkpointing, CPU offload): the strategy is built from it (:meth:`Candidate.strategy`),
and the planner simulates it through that strategy's own layout, policies and wrapping;
:class:`DeviceSpec` holds the target's memory, compute
and link speeds that turn a step's bytes and FLOPs into time. Both are frozen: built once from
the user's arguments, then passed around.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fullshard.errors import MisconfigurationError

if TYPE_CHECKING:
    from fullshard.strategies import ShardedStrategy
    from fullshard.strategies.parallel_layout import ParallelLayout

SHARDINGS = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD")
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true")


@dataclass(frozen=True)
class DeviceSpec:
    """The target device and its links, for the step-time model (docs/fsdp/plan.md, "Step cost").

    Attributes:
        type: ``"cuda"`` or ``"cpu"``.
        memory: bytes each process may use.
        flops: dense FLOP/s one device sustains at the compute dtype.
        intra_node_bandwidth: bytes/s each process sends to the others of its node (collectives).
        inter_node_bandwidth: bytes/s each process sends across nodes.
        host_bandwidth: bytes/s between device and host memory (CPU offload).
        host_optimizer_bandwidth: bytes/s the host streams through an offloaded optimizer step.
        collective_latency: seconds each collective costs besides its bytes (launch, handshake).
        overlap: whether communication runs beside compute (CUDA streams), so that a step takes
            the longer of the two; False (a CPU process with gloo): it takes their sum.
    """

    type: str
    memory: int
    flops: float
    intra_node_bandwidth: float
    inter_node_bandwidth: float
    host_bandwidth: float
    host_optimizer_bandwidth: float = 20e9
    collective_latency: float = 30e-6
    overlap: bool = True

    @classmethod
    def for_type(cls, device_type: str, memory: int, **overrides: Any) -> DeviceSpec:
        """Round numbers for a device type: ``"cuda"`` an H100-class GPU with NVLink in a node and
        400 Gb/s between nodes; ``"cpu"`` a CPU process with gloo over local TCP (no overlap of
        communication and compute; a collective's latency as FSDP2 issues it, launch, copies and
        the wait for the other processes included, as benchmarks/planner_choice.py measured it)."""
        base: dict[str, Any]
        if device_type == "cuda":
            base = dict(
                flops=400e12, intra_node_bandwidth=150e9, inter_node_bandwidth=40e9, host_bandwidth=20e9
            )
        elif device_type == "cpu":
            base = dict(  # FSDP2 over gloo on a 2-core machine: 0.9 GB/s, 1.66 ms a collective
                flops=50e9,
                intra_node_bandwidth=1e9,
                inter_node_bandwidth=1e9,
                host_bandwidth=1e12,
                collective_latency=1.5e-3,
                overlap=False,
            )
        else:
            raise MisconfigurationError(
                f"device type {device_type!r} is not one the planner knows: use 'cuda' or 'cpu'."
            )
        known = {*base, "host_optimizer_bandwidth", "collective_latency", "overlap"}
        unknown = set(overrides) - known
        if unknown:
            raise MisconfigurationError(
                f"DeviceSpec got unknown field(s) {sorted(unknown)}; accepted: {sorted(known)}."
            )
        return cls(type=device_type, memory=memory, **{**base, **overrides})  # type: ignore[arg-type]


@dataclass(frozen=True)
class Candidate:
    """One FSDP configuration the planner weighs, and the strategy that runs it (:meth:`strategy`).

    Attributes:
        engine: ``"fsdp2"`` (``FSDP2Strategy``) or ``"fsdp"`` (``FSDPStrategy``, FSDP1).
        sharding: one of :data:`SHARDINGS`.
        wrap: the class names that become units (the model's repeated blocks).
        checkpoint_every: 0: no activation checkpointing; k: every k-th wrapped block recomputes.
        cpu_offload: sharded parameters, gradients and optimizer step in host memory.
    """

    engine: str
    sharding: str
    wrap: tuple[str, ...]
    checkpoint_every: int
    cpu_offload: bool

    @property
    def checkpointing_label(self) -> str:
        """``none``, ``every layer`` or ``every k-th``."""
        if self.checkpoint_every == 0:
            return "none"
        if self.checkpoint_every == 1:
            return "every layer"
        nth = {2: "2nd", 3: "3rd"}.get(self.checkpoint_every, f"{self.checkpoint_every}th")
        return f"every {nth}"

    def label(self) -> str:
        """A short name for tables and logs."""
        parts = [self.engine, self.sharding, f"AC {self.checkpointing_label}"]
        if self.cpu_offload:
            parts.append("offload")
        return " ".join(parts)

    def strategy_kwargs(self, device_mesh: tuple[int, int] | None = None) -> dict[str, Any]:
        """Keyword arguments that make ``FSDPStrategy`` / ``FSDP2Strategy`` run this candidate.

        Every k-th block is chosen by position among the wrapped blocks, in ``modules()`` order, so
        the kwargs hold a policy object rather than class names when ``checkpoint_every > 1``.
        """
        kwargs: dict[str, Any] = {
            "sharding_strategy": self.sharding,
            "auto_wrap_policy": set(self.wrap),
            "cpu_offload": self.cpu_offload,
        }
        if self.checkpoint_every == 1:
            kwargs["activation_checkpointing_policy"] = set(self.wrap)
        elif self.checkpoint_every > 1:
            kwargs["activation_checkpointing_policy"] = every_kth_policy(self.wrap, self.checkpoint_every)
        if device_mesh is not None and self.sharding == "HYBRID_SHARD":
            kwargs["device_mesh"] = device_mesh
        return kwargs

    def strategy(self, device_mesh: tuple[int, int] | None = None, **settings: Any) -> ShardedStrategy:
        """The strategy that runs this candidate: ``FSDP2Strategy`` (engine ``"fsdp2"``) or
        ``FSDPStrategy`` (``"fsdp"``) built from :meth:`strategy_kwargs` (``device_mesh``: HYBRID_SHARD's
        ``(replicas, shard_size)``), with ``settings`` (the strategy's other arguments) added."""
        from fullshard.strategies import FSDP2Strategy, FSDPStrategy

        cls = FSDP2Strategy if self.engine == "fsdp2" else FSDPStrategy
        return cls(**self.strategy_kwargs(device_mesh), **settings)

    def layout(self, devices: int, num_nodes: int) -> ParallelLayout:
        """How this candidate's strategy lays out a job of ``num_nodes`` nodes of ``devices``
        processes (HYBRID_SHARD: a replica per node), as the strategy itself does."""
        job = self.strategy(device_mesh=(num_nodes, devices), cpu_mmap_threshold=None)
        return job.layout_for(devices * num_nodes)


def every_kth_policy(classes: tuple[str, ...], k: int) -> Any:
    """A torch auto-wrap policy object selecting every ``k``-th module whose class is named in
    ``classes``, counted in ``modules()`` order from the first (for ``activation_checkpointing_policy``).

    Raises:
        MisconfigurationError: ``k`` is not an int of at least 1.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise MisconfigurationError(f"checkpointing every k-th block needs an int k >= 1, got {k!r}.")
    from torch.distributed.fsdp.wrap import CustomPolicy

    names = tuple(classes)

    class EveryKth(CustomPolicy):
        # torch asks a policy for its modules through _run_policy (as fullshard.policies does);
        # the k-th ones are known only from the whole model, so it is answered here
        def _run_policy(self, root_module: Any, ignored_modules: Any, root_kwargs: Any) -> dict[Any, Any]:
            blocks = [m for m in root_module.modules() if type(m).__name__ in names]
            return {m: {} for m in blocks[k - 1 :: k]}

        def __repr__(self) -> str:
            return f"every_kth_policy({list(names)}, k={k})"

    return EveryKth(lambda module: False)
