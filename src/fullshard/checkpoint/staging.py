"""The host copy of a background save (``async_save=True``): what is copied when, into which buffers.

[Note: staging off the training thread]
A background save needs a copy of this rank's state that training cannot change while the files
are written. Copying it all on the training thread blocked training for about half the time of a
synchronous save, so the copy is split by who can change a tensor:

- parameters (their shards) and optimizer state change only in an optimizer step. The save keeps
  references to them (:class:`Staging`), and the background thread copies them before writing.
  Until that copy is done, every optimizer waits at the start of its ``step`` (:class:`StepGuard`,
  a step pre-hook of all optimizers), and a load waits for the whole save; forward and backward
  run meanwhile, reading the same tensors;
- everything else is copied on the training thread, at the save: buffers (BatchNorm's running
  statistics change in every forward), and the state's other values (deep copies).

What is guaranteed: the checkpoint holds the state as it was when ``save_checkpoint`` was called,
as long as nothing but an optimizer's ``step`` writes to parameters or optimizer state in place
before the copy is done. Code that does (a callback that clamps weights, ``p.data.copy_(...)``
in a hook) calls ``trainer.checkpoint_manager.wait_for_copy()`` first. This is the contract of torch's
own ``DefaultStager(StagingOptions(use_async_staging=True))``, which leaves the wait to the
caller (``synchronize_staging()``); here the optimizer step waits by itself. torch's stager is not
used: its background mode copies the whole state there, buffers included, which the next forward
changes, so the split and the wait above would be needed around it anyway. The check for
non-finite weights that a synchronous save runs before writing runs on the copy, in the
background thread too (a read of every parameter: most of a synchronous save's time on CPU).

On CUDA the copies go into pinned host buffers (:class:`StagingBuffers`), on a stream of their
own that first waits for the work queued before the save, and they are reused by the next save
(keyed by shape and dtype): no allocation or pinning per save. On CPU each save allocates its
copy and frees it once the files are written: a host copy held between saves would cost its
memory for the whole run.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from fullshard.checkpoint.events import checkpoint_event
from fullshard.checkpoint.lightning import _WRAPPER_COMPONENTS
from fullshard.errors import CheckpointError

BufferKey = tuple[tuple[int, ...], torch.dtype]


class StagingBuffers:
    """Host tensors for staged copies, by shape and dtype; pinned when ``pin``, kept for the next
    save when ``reuse``. One save at a time takes from it (the next save waits for the previous)."""

    def __init__(self, *, pin: bool, reuse: bool) -> None:
        self.pin = pin
        self.reuse = reuse
        self._free: dict[BufferKey, list[torch.Tensor]] = {}
        self._lock = threading.Lock()

    def take(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """A contiguous host tensor of ``shape`` and ``dtype``: a free one if kept, else a new one."""
        key = (tuple(shape), dtype)
        with self._lock:
            free = self._free.get(key)
            if free:
                return free.pop()
        return torch.empty(key[0], dtype=dtype, device="cpu", pin_memory=self.pin)

    def give_back(self, tensors: Iterable[torch.Tensor]) -> None:
        """Keep ``tensors`` for the next save (dropped unless ``reuse``)."""
        if not self.reuse:
            return
        with self._lock:
            for tensor in tensors:
                self._free.setdefault((tuple(tensor.shape), tensor.dtype), []).append(tensor)

    def kept_bytes(self) -> int:
        """Bytes of the tensors kept for the next save."""
        with self._lock:
            return sum(t.untyped_storage().nbytes() for free in self._free.values() for t in free)


class _Deferred:
    """A value of the state that the background thread copies (:meth:`Staging.copy`)."""

    __slots__ = ("key", "value")

    def __init__(self, value: Any, key: str) -> None:
        self.value, self.key = value, key


class Staging:
    """One save's host copy of the state (see [Note: staging off the training thread]).

    :attr:`state` has the structure of the state given. The values that :func:`stage` deferred
    are references to training's own until :meth:`copy` (in the background thread) replaces them
    by host copies; the others are copies already.
    """

    def __init__(self, buffers: StagingBuffers) -> None:
        self.state: Any = None
        self.nbytes = 0  # bytes of every host tensor of the copy, deferred ones included
        self.deferred = 0  # values left to copy()
        self.copied = threading.Event()  # set when copy() ended, copied or failed
        self._buffers = buffers
        self._taken: list[torch.Tensor] = []
        self._stream: Any = None  # CUDA: the copies' stream, and the event it waits for first
        self._ready: Any = None

    def plan(self, state: Any, where: str, defer: Callable[[str], bool] | None) -> None:
        """Copy what ``defer`` rejects now, keep references to the rest (the training thread)."""
        with torch.no_grad():
            self.state = self._visit(state, where, defer)
        if self._ready is not None:  # the copies wait for the work queued so far on that device
            self._ready.record(torch.cuda.current_stream(self._stream.device))

    def copy(self) -> None:
        """Replace the deferred values by host copies (the background thread); :attr:`copied` is
        set in any case."""
        try:
            checkpoint_event("async.copying")
            if self.deferred:
                with torch.no_grad():
                    if self._stream is not None:
                        self._stream.wait_event(self._ready)
                        with torch.cuda.stream(self._stream):
                            self.state = self._resolve(self.state)
                        self._stream.synchronize()
                    else:
                        self.state = self._resolve(self.state)
            checkpoint_event("async.copied")
        finally:
            self.copied.set()

    def release(self) -> None:
        """Drop the copy (its files are written, or the save failed); keep pinned buffers."""
        self.state = None
        taken, self._taken = self._taken, []
        self._buffers.give_back(taken)

    # ---------------------------------------------------------------------------- traversal
    def _visit(self, value: Any, key: str, defer: Callable[[str], bool] | None) -> Any:
        from torch.distributed.tensor import DTensor

        if defer is not None and defer(key):
            self._count(value, key)
            self.deferred += 1
            return _Deferred(value, key)
        counted = defer is not None  # at the save: count each copy; in copy(): counted already
        if isinstance(value, DTensor):
            local = self._host_copy(value.to_local(), counted)
            # The host copy under the shard's own spec, where it is: DTensor.from_local would move
            # it back onto the mesh's device (a second copy in GPU memory, written from there).
            # torch's own staging for async saves wraps its CPU copies the same way.
            return DTensor(local, value._spec, requires_grad=False)
        if isinstance(value, torch.Tensor):
            if type(value) not in (torch.Tensor, torch.nn.Parameter):
                raise CheckpointError(
                    f"async_save=True cannot copy {key} ({type(value).__name__}) to host memory for a background "
                    "save: it accepts plain tensors and DTensors (FSDP2Strategy's state). Save this model with "
                    "async_save=False (FSDPStrategy, FSDP1, always saves synchronously), or train it with "
                    "FSDP2Strategy(state_dict_type='sharded', async_save=True)."
                )
            return self._host_copy(value, counted)
        if isinstance(value, dict):
            return {k: self._visit(v, f"{key}.{k}", defer) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            items = [self._visit(v, f"{key}[{i}]", defer) for i, v in enumerate(value)]
            return items if isinstance(value, list) else tuple(items)
        return copy.deepcopy(value)

    def _count(self, value: Any, key: str) -> None:
        """Add the bytes of a deferred value's tensors; a tensor :meth:`_visit` refuses is refused
        now, at the save."""
        from torch.distributed.tensor import DTensor

        if isinstance(value, DTensor):
            value = value.to_local()
        if isinstance(value, torch.Tensor):
            if type(value) not in (torch.Tensor, torch.nn.Parameter):
                self._visit(value, key, None)  # raises its CheckpointError
            self.nbytes += value.numel() * value.element_size()
            if value.is_cuda and self._stream is None:
                # created at the save, on the training thread (as torch's DefaultStager does)
                self._stream, self._ready = torch.cuda.Stream(value.device), torch.cuda.Event()
        elif isinstance(value, dict):
            for k, v in value.items():
                self._count(v, f"{key}.{k}")
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                self._count(v, f"{key}[{i}]")

    def _resolve(self, value: Any) -> Any:
        if isinstance(value, _Deferred):
            return self._visit(value.value, value.key, None)
        if isinstance(value, dict):
            return {k: self._resolve(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._resolve(v) for v in value]
        if isinstance(value, tuple):
            return tuple(self._resolve(v) for v in value)
        return value

    def _host_copy(self, source: torch.Tensor, count: bool) -> torch.Tensor:
        """A host copy of ``source``: at the save (``count``: add its bytes) a blocking one; in
        :meth:`copy`, on CUDA, one queued on the staging stream, which copy() synchronises."""
        source = source.detach()
        if source.is_cuda:  # a pinned buffer, kept for the next save
            target = self._buffers.take(source.shape, source.dtype)
            self._taken.append(target)
        else:  # on CPU: a tensor of its own, freed with the copy
            target = torch.empty(source.shape, dtype=source.dtype, device="cpu")
        target.copy_(source, non_blocking=not count and source.is_cuda and target.is_pinned())
        if count:
            self.nbytes += target.numel() * target.element_size()
        return target


def stage(
    state: Any,
    where: str = "state",
    *,
    defer: Callable[[str], bool] | None = None,
    buffers: StagingBuffers | None = None,
) -> Staging:
    """A host copy of ``state`` that training cannot change (see [Note: staging off the training
    thread]): the values whose dotted key (``where.model.layer.weight``) ``defer`` accepts are
    copied later, by :meth:`Staging.copy`; the others now.

    Every tensor is copied (a ``DTensor``: its local shard, wrapped again with the same mesh and
    placements so that ``torch.distributed.checkpoint`` records the same global layout); dicts,
    lists and tuples are rebuilt; other values are deep-copied (optimizer steps kept as numbers).

    Raises:
        CheckpointError: a tensor of another type (FSDP1's ``ShardedTensor``), which cannot be
            copied shard by shard without communication.
    """
    staging = Staging(buffers or StagingBuffers(pin=False, reuse=False))
    staging.plan(state, where, defer if defer is not None else _never)
    return staging


def _never(key: str) -> bool:
    return False


def changed_only_by_steps(module: nn.Module | None, where: str = "state") -> Callable[[str], bool]:
    """Which keys of a save's state ``{"model": ..., "optimizers": ...}`` (dotted, as :func:`stage`
    names them) only an optimizer step changes: ``module``'s parameters and all optimizer state.
    Any other key (a buffer; a name that is not ``module``'s) is copied at the save."""
    names: set[str] = set()
    if module is not None:
        for name, _ in module.named_parameters(remove_duplicate=False):
            names.add(".".join(part for part in name.split(".") if part not in _WRAPPER_COMPONENTS))
    model, optimizers = f"{where}.model.", f"{where}.optimizers."
    return lambda key: key.startswith(optimizers) or (key.startswith(model) and key[len(model) :] in names)


class StepGuard:
    """Makes every optimizer's ``step`` wait until :attr:`Staging.copied` is set.

    A step pre-hook common to all optimizers (``torch.optim.optimizer.register_optimizer_step_pre_hook``):
    the Trainer's, whether or not the save was given them (``save_checkpoint(weights_only=True)``
    gives none), and any the user steps by hand. Registered by the save, on the training thread;
    removed there (:meth:`remove`) by the first step boundary, wait or save that finds the copy
    done. Until then a step that finds the copy done pays one ``Event.is_set()``.
    """

    def __init__(self, copied: threading.Event) -> None:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self._copied = copied
        self.waited_s = 0.0  # how long steps waited for the copy (benchmarks/async_save.py)
        self._handle: Any = register_optimizer_step_pre_hook(self._before_step)

    def _before_step(self, optimizer: Optimizer, args: Any, kwargs: Any) -> None:
        self.wait()

    def wait(self) -> None:
        """Return once the copy is done (at once if it is)."""
        if self._copied.is_set():
            return
        start = time.perf_counter()
        self._copied.wait()
        self.waited_s += time.perf_counter() - start

    def done(self) -> bool:
        return self._copied.is_set()

    def remove(self) -> None:
        """Unregister the hook (on the training thread: never while a step iterates the hooks)."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
