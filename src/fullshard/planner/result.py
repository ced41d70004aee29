"""The memory planner's answer (a :class:`MemoryPlan`): one row per candidate, the table, and the
choice. Not the wrap plan (:class:`fullshard.policies.WrapPlan`: what a strategy wraps) nor
``plan="auto"`` (the strategy argument that runs the planner); docs/fsdp/plan.md tells them apart."""

from __future__ import annotations

from dataclasses import dataclass, field

from fullshard.planner.config import Candidate

_KINDS = ("params", "grads", "optimizer", "activations", "comm")


def fmt_bytes(n: float) -> str:
    """``1.5 GiB``-style sizes."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


@dataclass(frozen=True)
class MemoryPlanRow:
    """One candidate's prediction for the busiest process (rank 0).

    Attributes:
        candidate: the configuration.
        peak: predicted peak device bytes of tensors during a training step.
        split: ``peak`` split into params, grads, optimizer, activations and comm (the gathered
            parameters and the all-gather / reduce-scatter buffers), at the moment of the peak.
        comm_bytes: bytes the process sends per step; ``host_bytes``: device<->host per step (offload).
        flops: FLOPs per step (recomputation included); ``seconds``: the modelled step time.
        fits: ``process_peak`` within the device memory less the headroom (and, where the plan was
            given a node's host memory, the node's ``host_peak`` within it less the headroom).
        modelled: how the row was obtained beyond a direct simulation (empty when simulated).
        host_peak: host bytes the process keeps under CPU offload: its shards of the parameters, a
            gradient as big for each, and the optimizer's state (0 without offload).
        overhead: bytes the process holds beyond its tensors (:mod:`fullshard.planner.overhead`:
            on CPU what gloo, glibc's heaps and code loaded during ``fit`` add; on CUDA the
            context, NCCL's buffers and the caching allocator's reserve).
    """

    candidate: Candidate
    peak: int
    split: dict[str, int]
    comm_bytes: int
    host_bytes: int
    flops: int
    seconds: float
    fits: bool
    modelled: str = ""
    host_peak: int = 0
    overhead: int = 0

    @property
    def process_peak(self) -> int:
        """The process's predicted peak: its tensors' (``peak``) and what is not a tensor (``overhead``)."""
        return self.peak + self.overhead

    def summary(self) -> str:
        """One line for the wrap plan: the configuration and its predicted peak, split."""
        split = ", ".join(f"{kind} {fmt_bytes(self.split.get(kind, 0))}" for kind in _KINDS)
        return (
            f"planner chose {self.candidate.label()}: predicted peak {fmt_bytes(self.peak)} of tensors per process "
            f"({split}), {fmt_bytes(self.process_peak)} with what is not a tensor"
        )


@dataclass(frozen=True)
class MemoryPlan:
    """The planner's result: every candidate, and the fastest that fits (None if none does).

    Attributes:
        rows: one per candidate, fastest first.
        choice: the chosen row, or None.
        device_memory: bytes per process planned against; ``headroom``: the fraction kept free.
        world_size, num_nodes, precision: the job planned for.
        seconds: wall time the planning took; ``notes``: what the planner assumed.
        host_memory: one node's host memory, where offload rows were checked against it.
        devices: processes per node.
    """

    rows: list[MemoryPlanRow]
    choice: MemoryPlanRow | None
    device_memory: int
    headroom: float
    world_size: int
    num_nodes: int
    precision: str
    seconds: float
    notes: list[str] = field(default_factory=list)
    host_memory: int | None = None  # of one node, where CPU-offload rows were checked against it
    devices: int = 1  # processes per node

    @property
    def budget(self) -> int:
        """Bytes a configuration may use: the device memory less the headroom."""
        return int(self.device_memory * (1 - self.headroom))

    def table(self, limit: int | None = None) -> str:
        """The candidates as a text table (the process's peak, its tensors' peak and their split,
        comm, step time)."""
        offload = any(row.candidate.cpu_offload for row in self.rows)
        header = (
            f"{'':2}{'configuration':<44} {'process':>10} {'tensors':>10} {'params':>10} {'grads':>10} {'optim':>10} "
            f"{'activ':>10} {'comm':>10} {'sent/step':>10} {'step':>9}"
            + (f" {'host':>10}" if offload else "")
        )
        lines = [
            f"FSDP plan: {self.world_size} process(es) on {self.num_nodes} node(s), {self.precision}, "
            f"{fmt_bytes(self.device_memory)} per process, {self.headroom:.0%} headroom "
            f"(budget {fmt_bytes(self.budget)}); planned in {self.seconds:.1f} s",
            header,
        ]
        for row in self.rows[:limit]:
            mark = "* " if row is self.choice else ("  " if row.fits else "x ")
            s = row.split
            lines.append(
                f"{mark}{row.candidate.label() + (' ~' if row.modelled else ''):<44} "
                f"{fmt_bytes(row.process_peak):>10} {fmt_bytes(row.peak):>10} "
                + " ".join(f"{fmt_bytes(s.get(k, 0)):>10}" for k in _KINDS)
                + f" {fmt_bytes(row.comm_bytes):>10} {row.seconds * 1e3:>7.1f}ms"
                + (f" {fmt_bytes(row.host_peak) if row.host_peak else '-':>10}" if offload else "")
            )
        if limit is not None and len(self.rows) > limit:
            lines.append(f"  ... {len(self.rows) - limit} more")
        lines.append(
            "  * chosen (fastest that fits)   x does not fit   ~ modelled from a simulated row (see notes); "
            "process: tensors and what is not a tensor (docs/fsdp/plan.md)"
        )
        if self.choice is None:
            smallest = min(self.rows, key=lambda r: r.process_peak)
            if smallest.process_peak <= self.budget and self.host_memory is not None:  # short of host memory
                per_node = self.devices
                lines.append(
                    f"  nothing fits: {smallest.candidate.label()} fits the device, but its node's {per_node} "
                    f"process(es) keep {per_node} x {fmt_bytes(smallest.host_peak)} in host memory, of "
                    f"{fmt_bytes(self.host_memory * (1 - self.headroom))}. Use more nodes, or hosts with more memory."
                )
            else:
                lines.append(
                    f"  nothing fits: the smallest, {smallest.candidate.label()}, needs {fmt_bytes(smallest.process_peak)} "
                    f"of {fmt_bytes(self.budget)}. Use more processes, a smaller batch, or bigger devices."
                )
        lines.extend(f"  note: {note}" for note in self.notes)
        return "\n".join(lines)


#: the older names of :class:`MemoryPlan` and :class:`MemoryPlanRow` (public since the planner's
#: first release; ``fullshard.planner`` exports both)
Plan = MemoryPlan
PlanRow = MemoryPlanRow
