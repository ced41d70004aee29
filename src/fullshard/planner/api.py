"""``fullshard.plan``: predict each process's peak memory for every FSDP configuration of a model,
and choose the fastest that fits (docs/fsdp/plan.md). Where the work runs: planner/forked.py.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import torch
from torch import nn

from fullshard.errors import MisconfigurationError
from fullshard.planner import data_dependent
from fullshard.planner.candidates import (
    SCALE_POINTS,
    cut_blocks,
    depth_and_reason,
    enumerate_candidates,
    extend_to_depth,
    repeated_blocks,
    scalable_depth,
)
from fullshard.planner.config import PRECISIONS, Candidate, DeviceSpec
from fullshard.planner.cost import step_cost
from fullshard.planner.forked import run_forked, usable_cores
from fullshard.planner.overhead import process_overhead
from fullshard.planner.result import MemoryPlan, MemoryPlanRow, fmt_bytes
from fullshard.planner.simulate import Simulated, meta_copy, simulate
from fullshard.planner.torch_tools import Phase
from fullshard.strategies.auto_plan import parse_bytes

#: default cap on simulation workers: each holds the model's fake copy (about 0.5 GB for a 7B one)
MAX_WORKERS = 8


def plan(
    module: nn.Module,
    example_batch: Any,
    *,
    devices: int,
    num_nodes: int = 1,
    device_memory: int | float | str | None = None,
    device_type: str | None = None,
    precision: str = "32-true",
    headroom: float = 0.05,
    wrap: tuple[str, ...] | list[str] | None = None,
    engines: tuple[str, ...] = ("fsdp2", "fsdp"),
    candidates: list[Candidate] | None = None,
    device: DeviceSpec | None = None,
    shardings: tuple[str, ...] | None = None,
    workers: int | None = None,
    host_memory: int | float | str | None = None,
) -> MemoryPlan:
    """Predict rank 0's peak memory and step cost for each FSDP configuration; choose the fastest that fits.

    Nothing of the model is allocated: it is copied to the meta device and run on fake tensors
    through its own ``training_step`` (a plain module: ``forward``, the output summed) with its
    own optimizer (docs/fsdp/plan.md).

    Args:
        module: the model (a ``fullshard.Module`` or any ``nn.Module``; on any device, meta included).
        example_batch: one batch as one process gets it (tensors: shapes and dtypes matter, not values).
        devices: processes per node; ``num_nodes``: nodes.
        device_memory: bytes per process (``"80GiB"``); None: the free memory of this CUDA device.
        device_type: ``"cuda"`` or ``"cpu"``; None: ``"cuda"`` when CUDA is available, else ``"cpu"``.
        precision: the Trainer's precision string (``"32-true"``, ``"bf16-mixed"``, ``"bf16-true"``, ...).
        headroom: the fraction of ``device_memory`` kept free on top of each row's process peak
            (its tensors and what is not a tensor, :mod:`fullshard.planner.overhead`), for the
            prediction's error (docs/fsdp/plan.md).
        wrap: class names of the blocks to wrap; None: the model's outermost repeated classes.
        engines: which strategies to weigh: ``"fsdp2"`` (FSDP2Strategy) and/or ``"fsdp"`` (FSDPStrategy).
        candidates: weigh these instead of the enumerated ones.
        device: compute and link speeds for the step-time model; None: :meth:`DeviceSpec.for_type`.
        shardings: weigh only these sharding strategies (None: all that apply).
        workers: processes to simulate in (None: one per usable core, at most
            :data:`MAX_WORKERS`; see [Note: simulating on several cores] in planner/forked.py).
        host_memory: host memory of one node (``"1TiB"``): a CPU-offload row fits only when the
            node's processes' offloaded state fits it less the headroom; None: not checked.

    Returns:
        A :class:`~fullshard.planner.result.MemoryPlan`: ``print(plan.table())``, ``plan.choice``.

    Raises:
        MisconfigurationError: an argument is out of range, the model has no repeated blocks and
            ``wrap`` is not given, or the step cannot be simulated.
        PlannerUnavailableError: this torch lacks a tool the planner needs.
    """
    started = time.perf_counter()
    device_type = _check_args(devices, num_nodes, precision, headroom, engines, device_type, workers)
    memory = _device_memory(device_memory, device_type)
    host = None if host_memory is None else parse_bytes(host_memory, "host_memory")
    spec = device or DeviceSpec.for_type(device_type, memory)
    job = _Job(devices, num_nodes, device_type, precision, headroom, memory, host, spec)
    run = functools.partial(_plan, module, example_batch, job, wrap, engines, candidates, shardings, workers)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        # see [Note: planning inside a running job] in planner/forked.py (the child times its own work)
        return run_forked([run], 1, forget_group=True)[0]
    return run(started)


@dataclasses.dataclass(frozen=True)
class _Job:
    """What :func:`plan` plans for, checked: the job's shape, precision and each device's memory."""

    devices: int
    num_nodes: int
    device_type: str
    precision: str
    headroom: float
    memory: int
    host: int | None
    spec: DeviceSpec


def _plan(
    module: nn.Module,
    example_batch: Any,
    job: _Job,
    wrap: tuple[str, ...] | list[str] | None,
    engines: tuple[str, ...],
    candidates: list[Candidate] | None,
    shardings: tuple[str, ...] | None,
    workers: int | None,
    started: float | None = None,
) -> MemoryPlan:
    """:func:`plan`'s work, in this process (``started``: when the call began; None: now)."""
    started = time.perf_counter() if started is None else started
    devices, num_nodes, memory, host = job.devices, job.num_nodes, job.memory, job.host
    model = meta_copy(module)
    wrap = _wrap_classes(module, model, wrap)
    num_blocks = sum(1 for m in model.modules() if type(m).__name__ in wrap)
    todo = _candidates_to_weigh(job, wrap, num_blocks, engines, candidates, shardings)
    world = todo[0].layout(devices, num_nodes).world_size  # every layout of the job covers it all
    replayed: list[str] = []  # what _simulate_probes says of a step replayed from a real forward
    sims = _simulate_probes(module, model, example_batch, todo, job, workers, replayed)
    notes = _notes(model, wrap, todo, devices, host, sims) + replayed
    rows = [
        _row(
            c,
            sims[(c.engine, c.sharding, c.wrap, c.checkpoint_every)],
            memory,
            host,
            job.headroom,
            job.precision,
            devices,
            num_nodes,
            job.spec,
            num_blocks,
            job.device_type,
        )
        for c in todo
    ]
    rows.sort(key=lambda r: (r.seconds, r.candidate.engine != "fsdp2", r.peak))
    fitting = [r for r in rows if r.fits]
    return MemoryPlan(
        rows,
        fitting[0] if fitting else None,
        memory,
        job.headroom,
        world,
        num_nodes,
        job.precision,
        time.perf_counter() - started,
        notes,
        host,
        devices,
    )


def _wrap_classes(
    module: nn.Module, model: nn.Module, wrap: tuple[str, ...] | list[str] | None
) -> tuple[str, ...]:
    """The class names of the blocks to wrap: ``wrap`` checked against ``model`` (the meta copy
    of ``module``), or its outermost repeated classes."""
    wrap = tuple(wrap) if wrap else repeated_blocks(model)
    if not wrap:
        raise MisconfigurationError(
            f"{type(module).__name__} has no repeated blocks for the planner to wrap (no module class occurs twice with "
            "parameters). Pass wrap=('MyBlock',) naming the classes to make FSDP units."
        )
    missing = [name for name in wrap if not any(type(m).__name__ == name for m in model.modules())]
    if missing:
        raise MisconfigurationError(
            f"wrap={list(wrap)} names {missing}, which {type(module).__name__} does not contain. "
            f"Its repeated classes are {list(repeated_blocks(model))}."
        )
    return wrap


def _candidates_to_weigh(
    job: _Job,
    wrap: tuple[str, ...],
    num_blocks: int,
    engines: tuple[str, ...],
    candidates: list[Candidate] | None,
    shardings: tuple[str, ...] | None,
) -> list[Candidate]:
    """The given ``candidates``, or every configuration of ``engines`` for the job, less those
    whose sharding is not among ``shardings``; refuses an empty list."""
    devices, num_nodes = job.devices, job.num_nodes
    todo = candidates or enumerate_candidates(
        wrap,
        num_blocks=num_blocks,
        num_nodes=num_nodes,
        devices=devices,
        device_type=job.device_type,
        engines=engines,
    )
    if shardings is not None:
        todo = [c for c in todo if c.sharding in shardings]
    if not todo:
        raise MisconfigurationError(
            f"shardings={shardings!r} leaves no candidate to weigh for {num_nodes} node(s) of {devices} process(es). "
            "Name shardings the job can run (HYBRID_SHARD needs several nodes of several processes), or pass None."
        )
    return todo


def _simulate_probes(
    module: nn.Module,
    model: nn.Module,
    example_batch: Any,
    todo: list[Candidate],
    job: _Job,
    workers: int | None,
    notes: list[str],
) -> dict[tuple[str, str, tuple[str, ...], int], Simulated]:
    """One simulation per memory behaviour (engine, sharding, wrap, checkpointing) among ``todo``,
    run in ``workers`` processes: offload rows are priced from the same row without offload. Each
    carries the FLOPs counted once ([Note: the step-time model]). A step with data-dependent
    operations is simulated again with the record of one real forward ([Note: data-dependent
    steps]), which ``notes`` (the plan's) then says."""
    probes: dict[tuple[str, str, tuple[str, ...], int], Candidate] = {}
    for candidate in todo:
        key = (candidate.engine, candidate.sharding, candidate.wrap, candidate.checkpoint_every)
        probes.setdefault(key, Candidate(*key, False))
    # the FLOPs are counted once, on a step without checkpointing where there is one (FSDP2's first)
    counted = min(probes, key=lambda key: (bool(probes[key].checkpoint_every), key[0] != "fsdp2"))
    depths = {key: scalable_depth(model, probe.wrap) for key, probe in probes.items()}

    def run(recording: data_dependent.Recording | None) -> list[Simulated]:
        jobs = [
            functools.partial(
                _simulate,
                model,
                example_batch,
                probe,
                depths[key],
                job.devices,
                job.num_nodes,
                job.precision,
                key == counted,
                job.device_type,
                recording,
            )
            for key, probe in probes.items()
        ]
        return run_forked(jobs, workers or min(usable_cores(), MAX_WORKERS))

    try:
        done = run(None)
    except data_dependent.NeedsRecording:  # recorded on the deepest model simulated
        wraps = {probe.wrap for probe in probes.values()}
        cut = wraps.pop() if len(wraps) == 1 and None not in depths.values() else None
        deepest = cut_blocks(model, cut, SCALE_POINTS[-1]) if cut is not None else model
        done = run(data_dependent.record(module, deepest, example_batch, job.precision))
        notes.append(
            "the step's data-dependent operations (expert routing, .item()) were replayed from one real forward on "
            "the example batch: its routing stands for every step's (see [Note: data-dependent steps])"
        )
    sims = dict(zip(probes, done, strict=True))
    flops = sims[counted]
    for key, sim in sims.items():  # see [Note: the step-time model]
        sims[key] = dataclasses.replace(
            sim,
            forward_flops=flops.forward_flops,
            backward_flops=flops.backward_flops,
            block_forward_flops=flops.block_forward_flops,
            counted_every=flops.counted_every,
        )
    return sims


def _notes(
    model: nn.Module,
    wrap: tuple[str, ...],
    todo: list[Candidate],
    devices: int,
    host: int | None,
    sims: dict[tuple[str, str, tuple[str, ...], int], Simulated],
) -> list[str]:
    """The lines under the plan's table: how the rows were simulated or priced."""
    notes: list[str] = []
    depth, extension = depth_and_reason(model, wrap)  # extended, or why simulated whole
    whole = [key for key, sim in sims.items() if not sim.extended_from]
    if depth is not None and whole:  # see [Note: a peak per phase] in planner/candidates.py
        labels = ", ".join(
            f"{e} {s} AC {Candidate(e, s, w, k, False).checkpointing_label}" for e, s, w, k in whole
        )
        extension += (
            f"; except {labels}: simulated whole, as a phase's peak moved within the phase between "
            f"{SCALE_POINTS[0]} and {SCALE_POINTS[1]} blocks (its line would give a negative figure)"
        )
    if extension:
        notes.append(extension)
    if any(c.cpu_offload for c in todo):
        notes.append(
            "offload rows (~) keep the sharded parameters, gradients and optimizer state in host memory "
            "(column host, per process); their peak is that of what stays on the device, at its own moment"
            + (
                f"; {devices} process(es) a node share {fmt_bytes(host)} of it"
                if host is not None
                else "; host memory not checked (host_memory=)"
            )
        )
    return notes


def _simulate(
    model: nn.Module,
    batch: Any,
    candidate: Candidate,
    depth: int | None,
    devices: int,
    num_nodes: int,
    precision: str,
    count_flops: bool,
    device_type: str = "cuda",
    recording: data_dependent.Recording | None = None,
) -> Simulated:
    run = functools.partial(
        simulate,
        recording=recording,
        batch=batch,
        candidate=candidate,
        layout=candidate.layout(devices, num_nodes),
        precision=precision,
        count_flops=count_flops,
        device_type=device_type,
    )
    if depth is None:
        return run(model)
    low, high = (run(cut_blocks(model, candidate.wrap, cut)) for cut in SCALE_POINTS)
    extended = extend_to_depth(low, high, SCALE_POINTS, depth)
    if extended is None:  # see [Note: a peak per phase] in planner/candidates.py
        return run(model)
    return dataclasses.replace(extended, param_numel=sum(p.numel() for p in model.parameters()))


def _row(
    candidate: Candidate,
    sim: Simulated,
    memory: int,
    host: int | None,
    headroom: float,
    precision: str,
    devices: int,
    num_nodes: int,
    spec: DeviceSpec,
    num_blocks: int,
    device_type: str,
) -> MemoryPlanRow:
    """One candidate's row, its memory that is not tensors from
    :func:`~fullshard.planner.overhead.process_overhead` for ``device_type``."""
    peak, split, modelled = sim.peak, dict(sim.split), ""
    host_peak = 0
    if candidate.cpu_offload:
        peak, split, host_peak = _offloaded(sim)
        modelled = "offload: sharded state moved to the host"
    half = {"bf16-mixed": 2, "16-mixed": 2, "bf16-true": 2, "16-true": 2}.get(precision, 4)
    cost = step_cost(
        candidate,
        numel=sim.param_numel,
        flops=_step_flops(sim, candidate, num_blocks),
        compute_bytes=half,
        reduce_bytes=4 if precision.endswith("mixed") or precision == "32-true" else 2,
        param_bytes=2 if precision.endswith("true") and precision != "32-true" else 4,
        layout=candidate.layout(devices, num_nodes),
        num_nodes=num_nodes,
        device=spec,
        units=num_blocks + 1,
    )
    world = candidate.layout(devices, num_nodes).world_size
    overhead = process_overhead(device_type, world_size=world, tensor_peak=peak)
    return MemoryPlanRow(
        candidate,
        peak,
        split,
        cost.comm_bytes,
        cost.host_bytes,
        cost.flops,
        cost.seconds,
        peak + overhead <= memory * (1 - headroom)
        and (host is None or host_peak * devices <= host * (1 - headroom)),
        modelled,
        host_peak,
        overhead,
    )


def _offloaded(sim: Simulated) -> tuple[int, dict[str, int], int]:
    """An offload row's device peak and its split: the highest phase's peak of what stays on the
    device, its own moment (the peak moves when the state leaves the device: [Note: a peak per
    phase] in planner/candidates.py); and the host bytes of a process: the shards, a gradient as
    big for each, the optimizer's state."""
    phases = sim.phases or (
        Phase(
            sim.peak,
            sim.split,
            sim.offloadable,
            sim.peak - sum(sim.offloadable.values()),
            {kind: value - sim.offloadable.get(kind, 0) for kind, value in sim.split.items()},
        ),
    )
    top = max(phases, key=lambda p: p.resident)
    shards = sim.offloadable  # at the step's peak: the shards, the optimizer's state
    host_peak = shards["params"] + max(shards["grads"], shards["params"]) + shards["optimizer"]
    return top.resident, dict(top.resident_split), host_peak


def _step_flops(sim: Simulated, candidate: Candidate, num_blocks: int) -> int:
    """A step's FLOPs: forward, backward, and the forward of the checkpointed blocks again (every
    ``k``-th of ``num_blocks`` identical blocks: ``num_blocks // k`` of the blocks' forward FLOPs).
    The counted backward already holds the recomputation of the step it was counted on."""

    def recomputed(every: int) -> float:
        return sim.block_forward_flops * (num_blocks // every) / num_blocks if every and num_blocks else 0.0

    backward = sim.backward_flops - recomputed(sim.counted_every)
    return int(sim.forward_flops + backward + recomputed(candidate.checkpoint_every))


def _check_args(
    devices: int,
    num_nodes: int,
    precision: str,
    headroom: float,
    engines: tuple[str, ...],
    device_type: str | None,
    workers: int | None = None,
) -> str:
    for name, value in (("devices", devices), ("num_nodes", num_nodes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise MisconfigurationError(
                f"{name}={value!r} must be an int of at least 1 (processes per node, nodes)."
            )
    if precision not in PRECISIONS:
        raise MisconfigurationError(
            f"precision={precision!r} is not one the planner knows; accepted: {', '.join(PRECISIONS)}."
        )
    if isinstance(headroom, bool) or not isinstance(headroom, int | float) or not 0 <= headroom < 1:
        raise MisconfigurationError(
            f"headroom={headroom!r} must be a fraction in [0, 1), such as 0.05 (5% kept free)."
        )
    bad = (
        [e for e in engines if e not in ("fsdp", "fsdp2")] if isinstance(engines, tuple | list) else [engines]
    )
    if bad or not engines:
        raise MisconfigurationError(
            f"engines={engines!r} must name 'fsdp2' and/or 'fsdp', such as ('fsdp2',)."
        )
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise MisconfigurationError(
            f"workers={workers!r} must be an int of at least 1 (processes to simulate in), or None for one per core."
        )
    if device_type is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device_type not in ("cuda", "cpu"):
        raise MisconfigurationError(f"device_type={device_type!r} must be 'cuda' or 'cpu'.")
    return device_type


def _device_memory(value: int | float | str | None, device_type: str) -> int:
    if value is not None:
        return parse_bytes(value)
    if device_type == "cuda" and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info()
        return int(free)
    raise MisconfigurationError(
        f"device_memory is needed to plan for {device_type} devices (only a CUDA device's free memory can be read). "
        "Pass device_memory='80GiB' (bytes per process)."
    )
