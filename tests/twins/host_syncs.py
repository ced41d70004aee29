"""Host-device synchronisations per training step, counted the same way under Lightning 2.6.6
and fullshard (tests/test_host_syncs.py holds fullshard at Lightning's count or below).

TWIN_FRAMEWORK=lightning /tmp/lvenv/bin/python tests/twins/host_syncs.py --out /tmp/l.json
TWIN_FRAMEWORK=fullshard python tests/twins/host_syncs.py --out /tmp/f.json

[Note: counting synchronisations on the CPU]
A read of a GPU tensor on the host waits for the device. On the CPU nothing waits, so the
count is of the operations that would wait on a GPU, seen at the two points every call passes:
- torch's dispatcher (a ``TorchDispatchMode``): ``aten._local_scalar_dense`` (``.item()``,
  ``float()``, ``int()``, ``bool()`` of a tensor, ``if tensor:``), and the ops whose output size
  depends on the data (``nonzero``, ``masked_select``, ``unique``, ...);
- Python's tensor methods (a ``TorchFunctionMode``): ``.tolist()``, ``.numpy()`` and ``.cpu()``,
  which on the CPU never reach the dispatcher (no copy is made), and on a GPU copy device memory
  to the host and wait for it.
The first read of host memory that a ``copy_(..., non_blocking=True)`` filled is not counted:
that is how a GPU's result is read without waiting (the reader checks the copy's CUDA event
first, as fullshard's non-finite check does: [Note: reading the loss without waiting] in
fullshard/trainer/nonfinite.py). What the count cannot see: a tensor the framework keeps on the
CPU in a GPU run too (a read of it is counted, though a GPU run would not wait for it), and a
wait that is not a read (``torch.cuda.synchronize()``, an event's ``synchronize``), and
``.to("cpu")`` (on the CPU it cannot be told from moving a batch to the device). Both
frameworks are counted by the same rules, over the same script; a step's count is the
difference between a run of ``LONG`` steps and one of ``SHORT``, divided by the steps between,
so that set-up and the end of training are left out, and each ``log_every_n_steps`` (50) logging
step is spread over the steps it covers.
"""

from __future__ import annotations

import collections
import os
import traceback
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import DataLoader, TensorDataset
from twin import imp, main

L = imp()
aten = torch.ops.aten
SHORT, LONG = 5, 55  # 50 steps between: one logging step (log_every_n_steps=50)
# ops that read a tensor's data on the host, or whose output size depends on it
SYNC_OPS = {
    aten._local_scalar_dense.default,
    aten.nonzero.default,
    aten.is_nonzero.default,
    aten.masked_select.default,
    aten._unique2.default,
    aten.unique_consecutive.default,
    aten.unique_dim.default,
    aten.repeat_interleave.Tensor,
}
HOST_METHODS = {"tolist", "numpy", "cpu"}


def _caller() -> str:
    """Where the framework made the call: the last three frames outside torch and this file."""
    frames = [
        f
        for f in traceback.extract_stack()[:-2]
        if f"{os.sep}torch{os.sep}" not in f.filename and not f.filename.endswith("host_syncs.py")
    ]
    return " < ".join(f"{Path(f.filename).name}:{f.lineno}" for f in frames[-3:])


class _Ops(TorchDispatchMode):
    def __init__(self, counter: SyncCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in SYNC_OPS:
            self.counter.note(str(func))
        out = func(*args, **kwargs)
        if func is aten.copy_.default and (kwargs.get("non_blocking") or (len(args) > 2 and args[2])):
            self.counter.staged.add(args[0].untyped_storage().data_ptr())  # a copy read without waiting
        return out


class _Methods(TorchFunctionMode):
    def __init__(self, counter: SyncCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        tensor = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if name in HOST_METHODS and tensor is not None:
            address = tensor.untyped_storage().data_ptr()
            if address in self.counter.staged:  # read once: its memory may hold another tensor later
                self.counter.staged.discard(address)
            else:
                self.counter.note(name)
        return func(*args, **kwargs)


class SyncCounter:
    """Counts what would synchronise a GPU ([Note: counting synchronisations on the CPU]), by
    kind and by where the call was made."""

    def __init__(self) -> None:
        self.kinds: collections.Counter[str] = collections.Counter()
        self.places: collections.Counter[str] = collections.Counter()
        self.staged: set[int] = set()
        self._modes = (_Ops(self), _Methods(self))

    def note(self, kind: str) -> None:
        self.kinds[kind] += 1
        self.places[f"{kind} at {_caller()}"] += 1

    def __enter__(self) -> SyncCounter:
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)


class Regressor(L.LightningModule):
    """What a user writes: a loss, logged every step (to the logger; with ``prog_bar``, also to
    the progress bar). SGD: Adam's step counts are CPU tensors it reads each step (on a GPU too,
    where reading them does not wait), which would only add the same to both counts."""

    def __init__(self, prog_bar: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.prog_bar = prog_bar
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, prog_bar=self.prog_bar)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=1e-3, momentum=0.9)


def _count(tmp: Path, steps: int, prog_bar: bool, **trainer_args: Any) -> SyncCounter:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(8 * LONG, 8, generator=generator)  # one epoch, even accumulating 2
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=steps, default_root_dir=tmp / str(steps), **trainer_args
    )
    with SyncCounter() as counter:
        trainer.fit(Regressor(prog_bar), data)
    return counter


def per_step(tmp: Path, prog_bar: bool = False, **trainer_args: Any) -> dict[str, Any]:
    """Synchronisations per training step (by kind, and the places that make them)."""
    short, long = _count(tmp, SHORT, prog_bar, **trainer_args), _count(tmp, LONG, prog_bar, **trainer_args)
    kinds = {k: (long.kinds[k] - short.kinds[k]) / (LONG - SHORT) for k in long.kinds | short.kinds}
    places = {k: (long.places[k] - short.places[k]) / (LONG - SHORT) for k in long.places | short.places}
    return {
        "per_step": sum(kinds.values()),
        "kinds": {k: v for k, v in kinds.items() if v},
        "places": {k: v for k, v in places.items() if v},
    }


def case_default(tmp: Path) -> dict[str, Any]:
    """The default Trainer: progress bar, logger, checkpointing, the non-finite check (fullshard)."""
    return per_step(tmp)


def case_progress_bar_metric(tmp: Path) -> dict[str, Any]:
    """A metric shown in the progress bar: read at each refresh (each step) by both."""
    return per_step(tmp, prog_bar=True)


def case_accumulating_and_clipping(tmp: Path) -> dict[str, Any]:
    return per_step(tmp, accumulate_grad_batches=2, gradient_clip_val=1.0)


def case_the_counter_counts(tmp: Path) -> dict[str, Any]:
    """The rules themselves: each kind of read counted once, a staged copy's first read not at all."""
    x = torch.arange(4.0)
    host = torch.empty(4)
    with SyncCounter() as counter:
        float(x[0]), x.tolist(), x.cpu(), x.numpy(), bool(x[1]), x.nonzero()
        host.copy_(x, non_blocking=True)
        host.tolist()  # not counted: a staged copy, read once
        host.tolist()  # counted: read again, it is a tensor like any other
    return dict(counter.kinds)


if __name__ == "__main__":
    main()
