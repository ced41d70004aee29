"""The one place the planner touches torch's private tools.

[Note: the planner's private torch tools]
Predicting a rank's memory without its devices needs three things torch has only privately
(read from torch 2.13): the fake process group (``torch.testing._internal.distributed.fake_pg``:
one process plays rank 0 of N, every collective returns at once), ``FakeTensorMode``
(``torch._subclasses``: tensors with shapes and dtypes but no storage), and ``FSDPMemTracker``
(``torch.distributed._tools``: a dispatch mode that files each live tensor under parameters,
gradients, optimizer state, activations, temporaries, inputs and FSDP2's all-gather and
reduce-scatter buffers, and records the peak), and for steps that read tensor values, the base class
of dispatch modes (``torch.utils._python_dispatch.TorchDispatchMode``) and the exceptions fake
tensors raise for such reads. There is no public API for any of them, so they
are imported here and nowhere else; a torch that lacks one raises :class:`PlannerUnavailableError`
naming it, rather than letting the planner return a wrong number.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode as TorchDispatchMode  # re-exported: see the Note

from fullshard.errors import MisconfigurationError

if TYPE_CHECKING:
    from fullshard.strategies.parallel_layout import ParallelLayout


class PlannerUnavailableError(MisconfigurationError):
    """This torch lacks a private tool the planner needs (see [Note: the planner's private torch tools])."""


def _missing(what: str, error: BaseException) -> PlannerUnavailableError:
    return PlannerUnavailableError(
        f"The memory planner needs {what}, which torch {torch.__version__} does not provide ({error}). "
        "fullshard's planner is tested on the torch versions its CI pins (torch>=2.6); install one of "
        "those, or choose the configuration by hand (docs/fsdp/plan.md)."
    )


def fake_tensor_mode() -> Any:
    """A fresh ``FakeTensorMode`` that accepts real tensors given to it (they become fake)."""
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode
    except ImportError as error:  # pragma: no cover - depends on torch
        raise _missing("torch._subclasses.fake_tensor.FakeTensorMode", error) from error
    return FakeTensorMode(allow_non_fake_inputs=True)


def data_dependent_errors() -> tuple[type[BaseException], ...]:
    """What ``FakeTensorMode`` raises for an operation whose output depends on tensor values (see
    [Note: data-dependent steps] in planner/data_dependent.py)."""
    try:
        from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
    except ImportError as error:  # pragma: no cover - depends on torch
        raise _missing("torch._subclasses.fake_tensor's data-dependent exceptions", error) from error
    return (DynamicOutputShapeException, DataDependentOutputException)


def outside_fake_mode() -> contextlib.AbstractContextManager[Any]:
    """A context in which ``FakeTensorMode`` is off for a moment (to compute on real tensors)."""
    try:
        from torch._subclasses.fake_tensor import unset_fake_temporarily
    except ImportError as error:  # pragma: no cover - depends on torch
        raise _missing("torch._subclasses.fake_tensor.unset_fake_temporarily", error) from error
    return unset_fake_temporarily()


@contextlib.contextmanager
def float_grouped_mm() -> Iterator[None]:
    """Fake tensors run ``torch._grouped_mm`` on float32 and float16 as the CPU kernel does.

    [Note: a fake kernel stricter than the CPU's]
    torch's fake (meta) kernel of ``aten._grouped_mm`` (torch 2.13) checks the CUDA kernel's rule,
    bf16 inputs only, and raises "Expected inputs of BF16 type" for float32; the CPU kernel takes
    float32 and float16, and Hugging Face's mixtures of experts call it so by default
    (``experts_implementation="grouped_mm"``) in a ``32-true`` run on CPU. Within this context a
    fake-tensor rule gives such a call its output (the meta kernel's shapes, unpadded: the CPU
    kernel pads nothing); bf16 calls and every other dtype still go to the meta kernel.
    """
    try:
        from torch._subclasses import fake_impls
    except ImportError as error:  # pragma: no cover - depends on torch
        raise _missing("torch._subclasses.fake_impls", error) from error
    op = getattr(torch.ops.aten, "_grouped_mm", None)
    rules = getattr(fake_impls, "op_implementations_dict", None)
    if op is None or rules is None or op.default in rules:  # no such op, or torch has a rule of its own
        yield
        return

    def grouped_mm(
        fake_mode: Any, func: Any, a: Any, b: Any, offs: Any = None, bias: Any = None, out_dtype: Any = None
    ) -> Any:
        if (
            a.dtype not in (torch.float32, torch.float16)
            or b.dtype != a.dtype
            or (offs is None and a.dim() == 2)
        ):
            return NotImplemented
        if a.dim() == 2:
            shape = [offs.size(0), a.size(0), b.size(1)] if b.dim() == 2 else [a.size(0), b.size(-1)]
        else:
            shape = [a.size(1), b.size(1)] if b.dim() == 2 else [a.size(0), a.size(1), b.size(-1)]
        with fake_mode:
            return torch.empty(shape, dtype=out_dtype or a.dtype, device=a.device)

    rules[op.default] = grouped_mm
    try:
        yield
    finally:
        rules.pop(op.default, None)
        # fake tensors cache an operation's output by its arguments, for every mode: forget the
        # rule's, so that a fake grouped_mm outside this context meets torch's own check again
        from torch._subclasses.fake_tensor import FakeTensorMode

        cache = getattr(FakeTensorMode, "cache", {})
        for key in [k for k in cache if getattr(k, "key", (None,))[0] is op.default]:
            del cache[key]


def memory_tracker(module: nn.Module, optimizer: torch.optim.Optimizer | None) -> Any:
    """torch's ``FSDPMemTracker`` over ``module`` (an FSDP2 model) and ``optimizer``, keeping the
    overall peak only.

    [Note: the overall peak only]
    After every operation the tracker compares the current total with the peak of every module
    that is running, walking all the modules it has seen (torch 2.13's ``_update_peak_stats``):
    a fifth of a simulated step's time on a 7B model, for per-module peaks the planner never
    reads. The subclass keeps that method's last part only, the overall peak and its snapshot,
    which is what :func:`peak_by_category` reads. A torch whose tracker lacks the method, or
    whose peak snapshot changes shape, fails :func:`peak_by_category`'s check or the planner's
    tests rather than giving a wrong number.
    """
    try:
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    except ImportError as error:  # pragma: no cover - depends on torch
        raise _missing("torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker", error) from error
    if not hasattr(FSDPMemTracker, "_update_peak_stats"):  # pragma: no cover - depends on torch
        raise _missing("FSDPMemTracker._update_peak_stats", AttributeError("no such method"))

    class PeakTracker(FSDPMemTracker):  # type: ignore[misc]  # see [Note: the overall peak only]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            #: the peak of what stays on the device under CPU offload (the total less the sharded
            #: state), and the snapshot at it, by device: [Note: a peak per phase] in candidates
            self.resident_peak: dict[Any, int] = {}
            self.resident_snap: dict[Any, dict[Any, int]] = {}

        def _update_peak_stats(self, peak_state: Any) -> None:
            for dev, dev_snap in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < dev_snap["Total"]:
                    self._peak_mem[dev] = dev_snap["Total"]
                    self._peak_mem_snap[dev] = dict(dev_snap)
                resident = dev_snap["Total"] - sum(v for k, v in dev_snap.items() if k in _HOST_KEYS)
                if self.resident_peak.get(dev, -1) < resident:
                    self.resident_peak[dev] = resident
                    self.resident_snap[dev] = dict(dev_snap)

        def restart_peaks(self) -> None:
            """Start new peaks from the memory alive now, as entering the tracker starts them."""
            current = self.get_tracker_snapshot()
            self._peak_mem_snap = {dev: dict(snap) for dev, snap in current.items()}
            self._peak_mem = {dev: snap["Total"] for dev, snap in current.items()}
            self.resident_peak, self.resident_snap = {}, {}

        def __enter__(self) -> Any:
            entered = super().__enter__()
            self._visit = _visiting_outputs()  # see [Note: the tracker's outputs, visited]
            self._visit.__enter__()
            return entered

        def __exit__(self, *args: Any) -> None:
            self._visit.__exit__(*args)
            super().__exit__(*args)

    try:
        from torch.distributed._tools.fsdp2_mem_tracker import _FSDPRefType

        _HOST_KEYS = {_FSDPRefType.SHARDED_PARAM, _FSDPRefType.SHARDED_GRAD, _FSDPRefType.OPT}
    except (ImportError, AttributeError) as error:  # pragma: no cover - depends on torch
        raise _missing("FSDPMemTracker's _FSDPRefType.SHARDED_PARAM, SHARDED_GRAD and OPT", error) from error

    return PeakTracker(module, optimizer)


def _for_each_tensor(kind: type, visit: Any, tree: Any) -> None:
    """``visit`` called on each leaf of ``tree`` that is a ``kind``, in pytree's leaf order: what
    ``tree_map_only(kind, visit, tree)`` calls, without building the mapped copy it returns."""
    from torch.utils._pytree import tree_iter

    if isinstance(tree, kind):  # an operation's one output, the common case
        visit(tree)
        return
    for leaf in tree_iter(tree):
        if isinstance(leaf, kind):
            visit(leaf)


@contextlib.contextmanager
def _visiting_outputs() -> Iterator[None]:
    """Within: the tracker module's ``tree_map_only`` is :func:`_for_each_tensor`.

    [Note: the tracker's outputs, visited]
    ``FSDPMemTracker``'s dispatch hands each operation's outputs to its ``_track`` through pytree's
    ``tree_map_only``, which flattens the outputs and builds their mapped copy, and the tracker
    throws the copy away (torch 2.13: the module's two calls, in ``__torch_dispatch__`` and
    ``track_inputs``, both discard it): a tenth of a plan's CPU time (a 7B Llama for 8 processes). While
    a planner's tracker is entered the module's name is bound to :func:`_for_each_tensor`, which
    makes the same calls on the same tensors in the same order and builds nothing, so every figure
    is the same (tests/test_planner_cost.py compares the rows). A torch whose module has no such
    name keeps its own code (slower, not wrong); one that used the mapped copy would fail, not
    count wrongly (the visitor returns None).
    """
    import torch.distributed._tools.fsdp2_mem_tracker as tracker_module

    mapped = getattr(tracker_module, "tree_map_only", None)
    if mapped is None:  # pragma: no cover - depends on torch
        yield
        return
    tracker_module.tree_map_only = _for_each_tensor  # type: ignore[attr-defined,assignment]
    try:
        yield
    finally:
        tracker_module.tree_map_only = mapped  # type: ignore[attr-defined]


#: the planner's names for the tracker's categories (``_FSDPRefType`` values, torch 2.13)
CATEGORIES = {
    "Sharded Param": "params",
    "Buffer": "params",
    "Unsharded Param": "comm",
    "All Gather": "comm",
    "Reduce Scatter": "comm",
    "Sharded Grad": "grads",
    "Unsharded Grad": "grads",
    "OptState": "optimizer",
    "Activation": "activations",
    "Temp": "activations",
    "Inputs": "activations",
}


def peak_by_category(tracker: Any, device: torch.device) -> tuple[int, dict[str, int]]:
    """The tracker's peak total on ``device`` and its split into the planner's categories."""
    snapshot = tracker.get_tracker_snapshot("peak")
    by_device: dict[Any, int] = snapshot.get(device) or next(iter(snapshot.values()), {})
    return int(by_device.get("Total", 0)), _split(by_device)


def _split(by_device: dict[Any, int]) -> dict[str, int]:
    """A tracker snapshot of one device split into the planner's categories (its total left out)."""
    split = {"params": 0, "grads": 0, "optimizer": 0, "activations": 0, "comm": 0}
    for key, value in by_device.items():
        name = getattr(key, "value", key)
        if name == "Total":
            continue
        if name not in CATEGORIES:
            raise PlannerUnavailableError(
                f"torch {torch.__version__}'s memory tracker reports a category {name!r} the planner does not know "
                f"(known: {', '.join(sorted(CATEGORIES))}); its prediction would be wrong. Use a torch version "
                "fullshard's CI pins."
            )
        split[CATEGORIES[name]] += int(value)
    return split


def offloadable_at_peak(tracker: Any) -> dict[str, int]:
    """Of the tracker's peak, the bytes CPU offload keeps in host memory: the sharded parameters,
    the sharded gradients and the optimizer state, by the planner's category."""
    found = {"params": 0, "grads": 0, "optimizer": 0}
    for snapshot in tracker.get_tracker_snapshot("peak").values():
        for kind, value in _host_state(snapshot).items():
            found[kind] += value
    return found


def _host_state(snapshot: dict[Any, int]) -> dict[str, int]:
    """Of one device's snapshot, what CPU offload keeps in host memory, by the planner's category."""
    kinds = {"Sharded Param": "params", "Sharded Grad": "grads", "OptState": "optimizer"}
    found = {"params": 0, "grads": 0, "optimizer": 0}
    for key, value in snapshot.items():
        name = getattr(key, "value", key)
        if name in kinds:
            found[kinds[name]] += int(value)
    return found


@dataclass(frozen=True)
class Phase:
    """The peak of one phase of a step (forward, backward, optimizer step): its total, split into
    the planner's categories, and the part of it CPU offload would keep in host memory; and the
    peak of what stays on the device under CPU offload (``resident``, split as ``resident_split``:
    its own moment, as the peak moves when the state leaves the device)."""

    peak: int
    split: dict[str, int]
    offloadable: dict[str, int]
    resident: int = 0
    resident_split: dict[str, int] = field(default_factory=dict)


def end_phase(tracker: Any, device: torch.device) -> Phase:
    """The peaks ``tracker`` (a :func:`memory_tracker`) saw since the last phase ended (or it was
    entered), and new peaks started from the memory alive now, as entering the tracker starts
    them (torch 2.13's ``MemTracker.__enter__``): [Note: a peak per phase] in
    fullshard.planner.candidates."""
    peak, split = peak_by_category(tracker, device)
    offloadable = offloadable_at_peak(tracker)
    snaps = getattr(tracker, "resident_snap", {})
    resident_snap = snaps.get(device) or next(iter(snaps.values()), None)
    if resident_snap is None:  # a tracker without it: the state taken out of the peak's moment
        resident_split = {kind: value - offloadable.get(kind, 0) for kind, value in split.items()}
    else:
        resident_split = _split(resident_snap)
        for kind, value in _host_state(resident_snap).items():
            resident_split[kind] -= value
    phase = Phase(peak, split, offloadable, sum(resident_split.values()), resident_split)
    tracker.restart_peaks()
    return phase


@dataclass(frozen=True)
class SimulatedWorld:
    """What a simulated job looks like from rank 0: its size and the mesh FSDP2 shards over."""

    world_size: int
    mesh: Any  # a DeviceMesh over the fake process group


@contextlib.contextmanager
def simulated_world(layout: ParallelLayout, device_type: str = "cpu") -> Iterator[SimulatedWorld]:
    """Make this process rank 0 of ``layout``'s processes over the fake process group, and the
    layout's mesh (:meth:`ParallelLayout.build_mesh`); the group is destroyed on exit.

    Raises:
        MisconfigurationError: a process group is already initialised in this process (plan in a
            fresh process: :func:`fullshard.planner.plan` forks one for that).
    """
    import torch.distributed as dist

    if dist.is_initialized():
        raise MisconfigurationError(
            "simulated_world() needs a process without a process group, but one is initialised here. "
            "Call fullshard.plan() (it plans in a forked process when a group exists), or plan before "
            "init_process_group()."
        )
    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError as error:  # pragma: no cover - depends on torch
        raise _missing(
            "the fake process group (torch.testing._internal.distributed.fake_pg)", error
        ) from error
    excepthook = sys.excepthook  # init_process_group wraps it to prefix "[rank0]:" each time
    dist.init_process_group("fake", rank=0, world_size=layout.world_size, store=FakeStore())
    try:
        yield SimulatedWorld(layout.world_size, layout.build_mesh(device_type))
    finally:
        dist.destroy_process_group()
        sys.excepthook = excepthook


_FORGOTTEN: list[Any] = []  # the groups a forked child forgot: see forget_process_group


def forget_process_group() -> None:
    """In a forked child of a process with a live process group: forget that group (never using
    it), so :func:`simulated_world` can make a fake one. Only for a child that exits without
    touching the parent's group (see [Note: planning inside a running job] in planner/forked.py)."""
    import torch.distributed.distributed_c10d as c10d

    world = c10d._world
    # kept alive until the child's os._exit: the last reference to a group dropped here would run
    # its destructor, which joins the backend's worker threads (gloo's), threads a fork does not
    # copy: the child hung there for ever under FSDPStrategy(plan="auto"), whose groups no device
    # mesh holds (FSDP2's mesh holds its own, so the FSDP2 case never reached the destructor)
    _FORGOTTEN.extend([world.default_pg, *world.pg_map, *world.tags_to_pg.values()])
    world.default_pg = None
    for mapping in (
        world.pg_map,
        world.pg_names,
        world.pg_group_ranks,
        world.pg_backend_config,
        world.tags_to_pg,
        world.pg_to_tag,
    ):
        mapping.clear()


class _StagedWork:
    """A collective's work that keeps gloo's staging buffer alive as long as the work is referenced
    (gloo's work object owns the buffer)."""

    def __init__(self, work: Any, staging: torch.Tensor) -> None:
        self._work, self._staging = work, staging

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        return True if self._work is None else self._work.wait(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


@contextlib.contextmanager
def gloo_staging() -> Iterator[None]:
    """Make the fake collectives FSDP2 calls hold the staging copy gloo makes on CPU.

    [Note: gloo's staging copies]
    On CPU, gloo's ``all_gather_into_tensor`` gathers into a flat buffer of its own the size of
    the output and copies it out, and ``reduce_scatter_tensor`` copies its input likewise
    (measured with torch 2.13: 8 MiB extra for an 8 MiB output or input); gloo's work object owns
    the buffer, so it lives as long as the work is referenced. NCCL on CUDA makes no such copy. The fake process group makes none, so
    for a CPU target the planner allocates the same buffer (fake) around FSDP2's
    ``all_gather_single`` / ``reduce_scatter_single`` calls, and the tracker counts it.
    """
    import torch.distributed as dist

    gather, scatter = dist.all_gather_single, dist.reduce_scatter_single

    def staged(call: Any, size_of: str) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            bound: dict[str, Any] = {
                "output": args[0] if args else kwargs.get("output", kwargs.get("output_tensor")),
                "input": args[1] if len(args) > 1 else kwargs.get("input", kwargs.get("input_tensor")),
            }
            staging = torch.empty_like(bound[size_of])
            work = call(*args, **kwargs)
            if kwargs.get("async_op"):
                return _StagedWork(work, staging)
            del staging
            return work

        return run

    dist.all_gather_single = staged(gather, "output")  # type: ignore[assignment]
    dist.reduce_scatter_single = staged(scatter, "input")  # type: ignore[assignment]
    try:
        yield
    finally:
        dist.all_gather_single, dist.reduce_scatter_single = gather, scatter  # type: ignore[assignment]
