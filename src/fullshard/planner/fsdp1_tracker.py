"""A memory tracker for an FSDP1 (``FullyShardedDataParallel``) model on fake tensors.

[Note: tracking FSDP1's storages]
torch (2.13) has no tracker that follows FSDP1 (see [Note: how a candidate is simulated] in
fullshard.planner.simulate), so this one watches storages, not modules. It is a dispatch mode:
every tensor an operation returns has a storage; a storage not seen before is counted, in full,
as long as it lives (a weak reference's callback notes when torch frees it), and FSDP1's
own way of allocating and freeing its gathered parameters and its mixed-precision shards,
``resize_`` on a storage that stays, is followed by wrapping ``UntypedStorage.resize_`` while the
tracker is entered. A storage is counted once however many tensors view it (a flat parameter, the
original parameters viewing it, its gradient and the original gradients viewing that), which is
what memory holds. Fake storages have no bytes but report the size a real one would.

Each storage is filed by kind when it is first seen: those alive at entry by what holds them
(the flat parameters' local shards and the buffers under ``params``, their gathered copies and
mixed-precision shards under ``comm``, gradients under ``grads``, the optimizer's state under
``optimizer``, the batch under ``activations``), those made inside the step under
``activations`` (activations and temporaries alike). A gradient made inside the step (the
unsharded flat gradient autograd accumulates, the shard FSDP1 reduce-scatters into) becomes a
gradient when FSDP1 attaches it: the tracker looks for them at each new peak, once the peak is
left (at the first free after it), so the split at the peak files them as gradients. That walk
visits the flat parameters only, which keeps it cheap next to the step.

[Note: frees settled later]
A weak reference's callback runs while torch is freeing the storage, sometimes in the middle of
FSDP1 replacing a gradient: touching a tensor there can crash the process. So the callback only
notes the storage; the next operation, ``resize_`` or leaving the tracker subtracts it (taking a
pending peak's split first, with everything alive at the peak still counted), before anything
new is counted, so a new storage that reuses a freed one's ``id`` is not mistaken for it. Only
frees happen between the notes and their settling, so the split is the peak's; a gradient made in
the step and dropped again in that window stays filed under activations (the total is exact).

FSDP1's flat parameters and their attributes, and the functions :func:`as_after_a_step` calls,
are private to torch (``FlatParamHandle`` on each
``FullyShardedDataParallel``'s ``_handle``; ``_local_shard``, ``_full_param_padded``, ``_mp_shard``,
``_saved_grad_shard`` ... on the flat parameter, torch 2.13); they are read here and nowhere else
in the planner. An attribute that is missing is treated as not there (a torch that renamed one
then fails the planner's accuracy tests rather than this module).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from fullshard.planner.torch_tools import Phase

KINDS = ("params", "grads", "optimizer", "activations", "comm")

#: the flat parameter's attributes holding its gathered copies (``comm``): the padded unsharded
#: parameter, its mixed-precision shard, the full-precision gathered copy (torch 2.13 names)
_GATHERED = ("_full_param_padded", "_mp_shard", "_full_prec_full_param_padded")
#: those holding its gradient shards kept between backward and the optimizer step
_GRAD_SHARDS = ("_saved_grad_shard", "_cpu_grad")


def flat_parameters(root: nn.Module) -> list[Any]:
    """The flat parameters of every ``FullyShardedDataParallel`` unit in ``root``."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    found = []
    for unit in FullyShardedDataParallel.fsdp_modules(root):
        handle = getattr(unit, "_handle", None)  # see [Note: tracking FSDP1's storages]
        if handle is not None:
            found.append(handle.flat_param)
    return found


@contextlib.contextmanager
def storage_checks_by_identity() -> Iterator[None]:
    """While entered, FSDP1 tells storages apart by identity and size, not by address.

    [Note: FSDP1's storage checks on fake tensors]
    FSDP1 (torch 2.13, ``torch.distributed.fsdp._flat_param``) checks whether a storage is
    allocated (``_data_ptr_allocated``: its address is not 0) and whether two tensors share one
    (``_same_storage``: equal addresses). Every fake storage has the address 0, so the first says
    "not allocated" and fails an assertion in ``_writeback_orig_params`` (SHARD_GRAD_OP, NO_SHARD:
    wherever it skips the sharded views), and the second says "shared" of any two. Inside this
    context they ask the same of a storage's size and of its identity (torch keeps one Python
    object per live storage), which on real tensors answer as the addresses do.
    """
    from torch.distributed.fsdp import _flat_param as module  # see [Note: tracking FSDP1's storages]

    flat_param: Any = module  # its helpers are private (not exported)
    allocated, same = flat_param._data_ptr_allocated, flat_param._same_storage
    flat_param._data_ptr_allocated = lambda tensor: tensor.untyped_storage().nbytes() > 0
    flat_param._same_storage = lambda a, b: a.untyped_storage() is b.untyped_storage()
    try:
        yield
    finally:
        flat_param._data_ptr_allocated, flat_param._same_storage = allocated, same


def as_after_a_step(root: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Put the FSDP1-wrapped ``root`` and ``optimizer`` as a first training step leaves them,
    without running one (see [Note: how an FSDP1 candidate is simulated] in
    fullshard.planner.simulate_fsdp1): FSDP1's lazy initialisation run, each unit whose flat
    parameter trains given a zero flat gradient shard, and the original parameters' gradients
    made views into it (``use_orig_params=True``), as FSDP1's end of backward does; then the
    optimizer steps once, making its state. FSDP1's functions for these are private (torch
    2.13: ``_runtime_utils._lazy_init``, ``FlatParamHandle._use_sharded_grad_views``)."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp import _runtime_utils as runtime  # see [Note: tracking FSDP1's storages]

    lazy_init: Any = runtime._lazy_init  # type: ignore[attr-defined]
    lazy_init(root, root)
    with torch.no_grad():
        for unit in FullyShardedDataParallel.fsdp_modules(root):
            handle = getattr(unit, "_handle", None)
            if handle is None or not handle.flat_param.requires_grad:
                continue
            handle.flat_param.grad = torch.zeros_like(handle.flat_param)
            if handle._use_orig_params:
                handle._use_sharded_grad_views()
    optimizer.step()


def _tensors(*trees: Any) -> Iterator[torch.Tensor]:
    for leaf in tree_leaves(list(trees)):
        if isinstance(leaf, torch.Tensor):
            yield leaf


class FSDP1MemoryTracker(TorchDispatchMode):
    """The peak of live storage bytes on this process while entered, split by kind (see [Note:
    tracking FSDP1's storages]); ``root``: the FSDP1-wrapped model, ``optimizer`` over it,
    ``inputs``: the batch."""

    def __init__(self, root: nn.Module, optimizer: torch.optim.Optimizer, inputs: Any) -> None:
        super().__init__()
        self._root, self._optimizer, self._inputs = root, optimizer, inputs
        self._flat = flat_parameters(root)
        self._live: dict[int, list[Any]] = {}  # id(storage) -> [bytes, kind, weak reference]
        self._totals = dict.fromkeys(KINDS, 0)
        self._total = 0
        self._pending = False  # a new peak whose split is not taken yet
        self._dead: list[int] = []  # storages freed since the last operation, not yet subtracted
        self._resize: Any = None
        self.peak = 0
        self.split = dict.fromkeys(KINDS, 0)
        #: of the peak, what CPU offload keeps in host memory: the sharded parameters, the
        #: sharded gradients, the optimizer's state
        self.offloadable = {"params": 0, "grads": 0, "optimizer": 0}

    # ------------------------------------------------------------------- entering and leaving
    def __enter__(self) -> FSDP1MemoryTracker:
        for kind, tensors in self._holders():
            for tensor in tensors:
                self._add(tensor.untyped_storage(), kind)
        original = self._resize = torch.UntypedStorage.resize_
        tracker = self

        def resize_(storage: Any, size: int) -> Any:
            tracker._settle()
            before = storage.nbytes()
            result = original(storage, size)
            tracker._resized(storage, before)
            return result

        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign,assignment]
        super().__enter__()
        return self

    def __exit__(self, *args: Any) -> None:
        super().__exit__(*args)
        torch.UntypedStorage.resize_ = self._resize  # type: ignore[method-assign]
        self._settle()
        if self._pending:
            self._take_split()

    def end_phase(self) -> Phase:
        """The peak since the last phase ended (or the tracker was entered), and a new peak started
        from what is alive now ([Note: a peak per phase] in fullshard.planner.candidates). What
        stays on the device under offload is taken at the peak's moment (as ``end_phase`` in
        torch_tools does for a tracker without its own record of it)."""
        self._settle()
        if self._pending:
            self._take_split()
        resident = {kind: value - self.offloadable.get(kind, 0) for kind, value in self.split.items()}
        phase = Phase(self.peak, dict(self.split), dict(self.offloadable), sum(resident.values()), resident)
        self.peak = self._total
        self._take_split()
        return phase

    def _holders(self) -> Iterable[tuple[str, Iterable[torch.Tensor]]]:
        """What is alive at entry, by kind (the first kind a storage is found under wins)."""
        flat = self._flat
        yield "comm", [t for p in flat for t in _attributes(p, _GATHERED)]
        yield "params", [t for p in flat for t in _attributes(p, ("_local_shard",))]
        yield "params", [*self._root.parameters(), *self._root.buffers()]
        yield "grads", [t for p in flat for t in _attributes(p, ("grad", *_GRAD_SHARDS))]
        yield "grads", [p.grad for p in self._root.parameters() if p.grad is not None]
        yield "optimizer", list(_tensors(self._optimizer.state_dict()["state"]))
        yield "activations", list(_tensors(self._inputs))

    # ------------------------------------------------------------------------ the accounting
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self._settle()
        out = func(*args, **(kwargs or {}))
        self._settle()
        if isinstance(out, torch.Tensor):  # most operations: no tree to walk
            self._add(out.untyped_storage(), "activations")
        else:
            for tensor in _tensors(out):
                self._add(tensor.untyped_storage(), "activations")
        return out

    def _add(self, storage: Any, kind: str) -> None:
        key = id(storage)
        if key in self._live:
            return
        nbytes = storage.nbytes()
        self._live[key] = [nbytes, kind, weakref.ref(storage, lambda _: self._dead.append(key))]
        self._grow(kind, nbytes)

    def _grow(self, kind: str, nbytes: int) -> None:
        self._totals[kind] += nbytes
        self._total += nbytes
        if nbytes > 0 and self._total > self.peak:
            self.peak = self._total
            self._pending = True

    def _shrink(self, kind: str, nbytes: int) -> None:
        if self._pending and nbytes > 0:  # leaving a peak: its split is what is alive now
            self._take_split()
        self._totals[kind] -= nbytes
        self._total -= nbytes

    def _settle(self) -> None:
        """Subtract the storages freed since the last call (see [Note: frees settled later])."""
        while self._dead:
            key = self._dead.pop()
            entry = self._live.get(key)
            if entry is not None:
                self._shrink(entry[1], entry[0])  # a pending split is taken first, with it alive
                del self._live[key]

    def _resized(self, storage: Any, before: int) -> None:
        entry = self._live.get(id(storage))
        if entry is None:  # not seen before: counted from now, at its new size
            self._add(storage, "comm")
            return
        after = storage.nbytes()
        entry[0] = after
        if after > before:
            self._grow(entry[1], after - before)
        elif after < before:
            self._shrink(entry[1], before - after)

    def _take_split(self) -> None:
        """File the gradients made in the step as such, then keep the split and what offload
        would move of what is alive now (the peak)."""
        self._pending = False
        sharded: dict[int, int] = {}  # storage -> bytes, of the gradient shards
        for flat in self._flat:
            shard = getattr(flat, "_local_shard", None)
            for name in ("grad", *_GRAD_SHARDS):
                grad = getattr(flat, name, None)
                entry = (
                    None if not isinstance(grad, torch.Tensor) else self._live.get(id(grad.untyped_storage()))
                )
                if grad is None or entry is None:
                    continue
                if entry[1] == "activations":
                    self._totals["activations"] -= entry[0]
                    self._totals["grads"] += entry[0]
                    entry[1] = "grads"
                if shard is not None and grad.numel() == shard.numel():
                    sharded[id(grad.untyped_storage())] = entry[0]
        self.split = dict(self._totals)
        local = {id(s.untyped_storage()): s for p in self._flat for s in _attributes(p, ("_local_shard",))}
        self.offloadable = {
            "params": sum(self._live[k][0] for k in local if k in self._live),
            "grads": sum(sharded.values()),
            "optimizer": self._totals["optimizer"],
        }


def _attributes(flat: Any, names: Iterable[str]) -> list[torch.Tensor]:
    return [t for t in (getattr(flat, name, None) for name in names) if isinstance(t, torch.Tensor)]
