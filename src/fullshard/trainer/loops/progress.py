"""``Progress``: where training is, the one record of it. The fit loop owns it and is the only
writer; the Trainer's ``current_epoch`` and ``global_step`` read it, and a checkpoint's
``"loops"`` entry is its :meth:`Progress.state_dict`."""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fullshard.errors import CorruptCheckpointError
from fullshard.trainer.data import EpochDraws, SavedPosition


@dataclass
class Progress:
    """Loop progress of ``fit``.

    ``batches_in_epoch`` is the batch position in the current epoch, ``batches_that_stepped``
    the count of accumulation boundaries passed (the step number loggers get, see [Note: logger
    steps] in fullshard.trainer.trainer), ``total_batch_idx`` the batches run in all epochs (the
    position the ranks agree on at a preemption). ``epoch_start`` is the (batch index, samples
    consumed) where this run of the epoch began; ``resume_point`` the (epoch, batches, samples)
    of an epoch cut short (see [Note: epochs cut short] in fit_loop.py). ``epoch_rng_state`` is
    the global generator's state right before the current epoch's iterator was made, and
    ``resumed_draws`` what a checkpoint recorded of the epoch it cut, until that epoch's
    iterator is made again ([Note: the epoch's draws] in fullshard.trainer.data).
    """

    epoch: int = 0
    global_step: int = 0
    batches_in_epoch: int = 0
    batches_that_stepped: int = 0
    total_batch_idx: int = 0
    epoch_finished: bool = False
    epoch_start: tuple[int, int] = (0, 0)
    resume_point: tuple[int, int, int | None] | None = None
    # from a checkpoint: the whole state until the fit loop starts, then the position and the
    # data order until the training loader exists
    pending: dict[str, Any] | None = None
    saved_position: SavedPosition | None = None
    data_seed: int | None = None
    epoch_end_pending: bool = False
    epoch_rng_state: torch.Tensor | None = None
    resumed_draws: EpochDraws | None = None

    def state_dict(
        self,
        samples_in_epoch: int | None,
        data_seed: int,
        loader_positions: Callable[[int], list[dict[str, int | None]]] | None = None,
        order_state: torch.Tensor | None = None,
    ) -> dict[str, Any]:
        """The checkpoint's ``"loops"`` entry; an epoch cut short is saved at its cut.
        ``loader_positions``: a combined loader's inner positions after a number of batches;
        ``order_state``: the state that permuted the epoch's order (:class:`EpochDraws`)."""
        epoch, batches, samples = self.resume_point or (self.epoch, self.batches_in_epoch, samples_in_epoch)
        extra: dict[str, Any] = (
            {} if loader_positions is None else {"loader_positions": loader_positions(batches)}
        )
        if batches and self.epoch_rng_state is not None:  # inside an epoch: what it drew
            extra["epoch_rng_state"] = _as_bytes(self.epoch_rng_state)
            extra["epoch_order_state"] = None if order_state is None else _as_bytes(order_state)
        return {
            **extra,
            "epoch": epoch,
            "global_step": self.global_step,
            "batches_that_stepped": self.batches_that_stepped,
            "batches_in_epoch": batches,
            "samples_in_epoch": samples,
            "epoch_finished": self.epoch_finished,
            "total_batch_idx": self.total_batch_idx,
            "data_seed": data_seed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take a checkpoint's ``"loops"`` entry (with the ``world_size`` that wrote it). The
        position in the epoch is placed in the training loader later (see
        ``loops.resume.place_restored_position``); a checkpoint written at the end of an epoch keeps
        that epoch's number until then (Lightning shows it during the sanity run)."""
        self.global_step = int(state["global_step"])
        # the same as global_step, except under manual optimization (several steps per batch);
        # absent from checkpoints written before it was recorded, and from Lightning's: at most
        # the batches run, which count it ([Note: loop counters checked on resume])
        total = state.get("total_batch_idx")
        stepped = self.global_step if total is None else min(self.global_step, int(total))
        self.batches_that_stepped = int(state.get("batches_that_stepped", stepped))
        self.epoch = int(state["epoch"])
        self.batches_in_epoch = int(state["batches_in_epoch"])
        samples, world_size = state.get("samples_in_epoch"), state.get("world_size")
        inner = state.get("loader_positions")  # a combined loader's: [{"batches", "samples", ...}]
        self.saved_position = SavedPosition(
            batches=self.batches_in_epoch,
            samples=None if samples is None else int(samples),
            world_size=None if world_size is None else int(world_size),
            loaders=None
            if inner is None
            else tuple(
                (int(p["batches"]), None if p["samples"] is None else int(p["samples"])) for p in inner
            ),
        )
        self.epoch_start = (self.batches_in_epoch, 0)
        self.total_batch_idx = int(state.get("total_batch_idx", 0))
        seed = state.get("data_seed")  # None in checkpoints written before it was recorded
        self.data_seed = None if seed is None else int(seed)
        rng_state, order_state = (_as_state(state, k) for k in ("epoch_rng_state", "epoch_order_state"))
        if rng_state is None and self.data_seed is not None and self.batches_in_epoch:
            # written before the draws were recorded: every order was seeded by data_seed + epoch
            order_state = torch.Generator().manual_seed(self.data_seed + self.epoch).get_state()
        self.resumed_draws = EpochDraws(rng_state, order_state)
        self.epoch_finished = False
        self.epoch_end_pending = bool(state.get("epoch_finished"))

    def snapshot(self) -> Progress:
        """A copy of the whole record, in memory (more than :meth:`state_dict` keeps: what a
        checkpoint pending or restored holds too), for :meth:`restore`."""
        return copy.deepcopy(self)

    def restore(self, snapshot: Progress) -> None:
        """Become what :meth:`snapshot` recorded (this object stays: the loops hold it)."""
        for field in dataclasses.fields(self):
            setattr(self, field.name, copy.deepcopy(getattr(snapshot, field.name)))

    def start_next_epoch(self) -> None:
        """Move on to the next epoch, at its first batch."""
        self.epoch += 1
        self.batches_in_epoch = 0
        self.epoch_start = (0, 0)
        self.epoch_finished = False


def _as_bytes(state: torch.Tensor) -> bytes:
    """A generator state as a checkpoint keeps it (plain bytes: comparable, loadable with
    ``weights_only=True``)."""
    return bytes(state.tolist())


def _as_state(loops: dict[str, Any], key: str) -> torch.Tensor | None:
    """The generator state ``loops[key]`` holds (None when absent), checked: a CPU generator's
    state is 5056 bytes."""
    data = loops.get(key)
    if data is None:
        return None
    expected = _state_bytes()
    if not isinstance(data, bytes) or len(data) != expected:
        raise CorruptCheckpointError(
            f"The checkpoint's loops[{key!r}] is not a random-number generator state ({expected} bytes), "
            f"got {type(data).__name__}{f' of {len(data)} bytes' if isinstance(data, bytes) else ''}. "
            "Resume from a checkpoint written by Trainer.save_checkpoint(), or start afresh from its "
            "weights with fit(..., ckpt_weights_only=True)."
        )
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


@functools.cache
def _state_bytes() -> int:
    """The size of a CPU generator's state. Asked on first need, not at import: an allocation at
    ``import fullshard`` would make torch read THP_MEM_ALLOC_ENABLE before the FSDP strategy sets
    it (fullshard/strategies/cpu_memory.py)."""
    return int(torch.Generator().get_state().numel())
