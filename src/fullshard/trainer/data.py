"""Dataloader preparation: distributed, resumable sampling with a fixed order per epoch.

[Note: reproducible data order]
For map-style datasets the Trainer rebuilds the user's ``DataLoader`` around a
:class:`ResumableDistributedSampler`: each process reads its own share of an epoch's order, and a
resumed run can start in the middle of an epoch by skipping the samples already seen. Under a
distributed strategy the order depends only on the seed and the epoch number; a checkpoint
records the seed (``data_seed``) and a resumed run draws its orders from it, whatever
``seed_everything`` was given this time: the rest of a cut epoch is then the rest of the order the
checkpoint was written in, and the later epochs are those of the uninterrupted run. Iterable
datasets and custom samplers are used as given (resuming them mid-epoch is exact only on as many
processes as wrote the checkpoint).

[Note: the epoch's draws]
A ported script must see Lightning's random numbers, so the rebuilt loaders draw from the global
torch generator what Lightning's draw: making an iterator draws its base seed (one int64, from
which the workers are seeded) from the loader's ``generator``, the global one when it has none,
at every epoch and every validation run; on one device without a distributed strategy a
shuffling loader's ``RandomSampler`` draws one more int64 when its first batch is fetched and
permutes the epoch with a generator seeded by it (``draws_order``). To resume such an epoch in
its middle, the fit loop records, when it makes the epoch's iterator, the global generator's
state right before, and the sampler keeps the state of the generator that permuted the epoch;
the checkpoint's loop state holds both (``epoch_rng_state``, ``epoch_order_state``:
:class:`EpochDraws`). The resumed run makes the epoch's iterator from the recorded state (and
replays a loader it cannot start at a sample index from it, so that a sampler of the user's
draws its order again) and permutes the epoch again from the recorded order state; then the
checkpoint's own states come back (they were taken after those draws). A checkpoint written at the end of an epoch has its random-number states put back
before the next epoch's iterator is made, which then draws as the uninterrupted run did. Resumed
on another number of processes, the cut epoch goes on in its recorded order whichever sampler
this run uses; the later epochs follow this run's rule.

[Note: the training sampler's order]
Under its distributed strategies (DDP, FSDP, model parallel, on any number of devices) Lightning
gives a training loader a ``DistributedSampler`` built with ``shuffle=True`` whatever the loader
said, seeded by ``seed_everything`` (0 without it); evaluation loaders keep their ``shuffle``.
fullshard does the same by default, so a ported script trains on the same samples, on the same
rank, in the same order (:class:`ResumableDistributedSampler` draws an epoch's order as
``DistributedSampler`` does). ``use_distributed_sampler="keep_shuffle"`` keeps the loader's own
order instead; either way the sampler is resumable. Under ``SingleDeviceStrategy`` Lightning adds
no sampler: the loader's ``shuffle`` holds, and a shuffling loader's order is its
``RandomSampler``'s, drawn from the global generator at each epoch, as fullshard draws it
(``draws_order``; see [Note: the epoch's draws]).

[Note: resuming at another world size]
Under ``DistributedSampler``'s split (position ``i`` of the padded epoch order goes to rank
``i % N``), after ``b`` batches of size ``B`` on each of ``N`` processes the processes together
have consumed exactly the positions ``[0, b*B*N)``: a prefix, whose length (capped at the
dataset's) the checkpoint records as ``samples_in_epoch``. A run resumed on ``M`` processes
trains on the rest of the order, ``[C, L)`` (``C`` recorded, ``L`` the dataset's length), split as ``DistributedSampler`` would split it
(``rest[rank::M]``) and padded to a multiple of ``M`` with the order's first positions, as
``DistributedSampler`` pads a whole epoch: for ``M == N`` these are exactly the indices of the
uninterrupted run. ``len(loader)`` stays the length of a whole epoch, and the resumed epoch
starts at batch index ``len(loader) - (batches left)``, so that it ends where a whole epoch
ends (``is_last_batch``, epoch schedulers, the last accumulation window); for ``M == N`` that
index is ``b``. The count goes on from where the resumed run started (``C`` plus ``B*M`` per
batch since), so a second resume composes. With ``limit_train_batches`` the epoch still stops
at the limit in batches of this run: on another world size, to within about a batch of the
samples the limit covers there. Loaders that are not resumable by index replay the epoch and
skip the batches each process had read, which is exact only on as many processes as wrote the
checkpoint; on another number they warn. Under tensor parallelism ``N`` and ``M`` count data
replicas, not processes ([Note: data-parallel ranks] in fullshard.strategies.strategy): a 2 x 2
run's checkpoint resumes exactly on 4 processes of FSDP alone, which read 4 parts where it read 2.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)

from fullshard.errors import MisconfigurationError
from fullshard.rank_zero import rank_zero_warn
from fullshard.seed import seed_worker, seed_workers_requested


def shard_indices(order: list[int], offset: int, rank: int, num_replicas: int) -> list[int]:
    """Rank ``rank``'s share of the positions ``[offset, len(order))`` of an epoch's ``order``,
    split and padded as ``DistributedSampler`` splits a whole epoch (see
    [Note: resuming at another world size]); with ``offset=0``, exactly its indices."""
    rest = order[offset:]
    padding = -len(rest) % num_replicas
    if padding:
        rest += (order * math.ceil(padding / len(order)))[:padding]
    return rest[rank::num_replicas]


class ResumableDistributedSampler(DistributedSampler[Any]):
    """A ``DistributedSampler`` that can start the current epoch at sample ``offset`` of its
    order, on any number of processes (see [Note: resuming at another world size]).

    ``draws_order``: shuffle as a ``RandomSampler`` does (Lightning on one device without a
    distributed strategy), from a seed drawn from the global generator when an epoch's iteration
    starts (or from ``generator``, the loader's own), instead of ``seed + epoch``. Either way the
    state of the generator that permuted the epoch is kept (:attr:`order_state`), so that a
    resumed run can permute the rest of that epoch the same (see [Note: the epoch's draws])."""

    def __init__(
        self,
        dataset: Dataset[Any],
        *,
        draws_order: bool = False,
        generator: torch.Generator | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(dataset, **kwargs)
        self.length: int = len(dataset)  # type: ignore[arg-type]  # map-style: has a length
        self.offset = 0
        self.offset_epoch = -1
        self.draws_order = draws_order
        self.generator = generator
        self.order_state: torch.Tensor | None = None
        """The state of the generator that permuted the current epoch, before it did (None: unshuffled)."""
        self.resumed_order: tuple[int, torch.Tensor] | None = None  # (epoch, order_state) to permute it again

    def _order_generator(self) -> torch.Generator:
        resumed, self.resumed_order = self.resumed_order, None
        if resumed is not None and resumed[0] == self.epoch:
            generator = torch.Generator()
            generator.set_state(resumed[1])
            return generator
        if not self.draws_order:
            return torch.Generator().manual_seed(self.seed + self.epoch)
        if self.generator is not None:
            return self.generator
        # RandomSampler's draw: an int64 from the global generator seeds the epoch's permutation
        return torch.Generator().manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))

    def epoch_order(self) -> list[int]:
        """The dataset indices of the current epoch in order, as ``DistributedSampler`` (or, with
        ``draws_order``, ``RandomSampler``) draws them; drawing it is starting the epoch."""
        if not self.shuffle:
            self.order_state = None
            return list(range(self.length))
        generator = self._order_generator()
        self.order_state = generator.get_state()
        return torch.randperm(self.length, generator=generator).tolist()

    def __iter__(self) -> Iterator[Any]:
        # only for the epoch being resumed: an iterator that was never advanced (a resumed epoch
        # with nothing left) must not carry the offset over into the next epoch
        offset = self.offset if self.offset_epoch == self.epoch else 0
        self.offset = 0
        return iter(shard_indices(self.epoch_order(), offset, self.rank, self.num_replicas))


@dataclass(frozen=True)
class EpochDraws:
    """What an epoch's iteration drew, as a checkpoint records it to resume that epoch (see
    [Note: the epoch's draws]): the global generator's state right before the epoch's iterator
    was made (the iterator's base seed, for the workers, is drawn from it) and the state of the
    generator that permuted the epoch's order (None: not recorded, or unshuffled)."""

    rng_state: torch.Tensor | None
    order_state: torch.Tensor | None


@dataclass(frozen=True)
class SavedPosition:
    """Where a checkpoint left an epoch: after ``batches`` batches on each of ``world_size``
    processes (None: not known, as for a Lightning checkpoint), which consumed the first
    ``samples`` positions of the epoch's order (None: a checkpoint that did not record it)."""

    batches: int
    samples: int | None
    world_size: int | None
    loaders: tuple[tuple[int, int | None], ...] | None = None
    """A combined loader's inner loaders: (batches, samples) each ([Note: resuming combined
    loaders] in fullshard.trainer.combined_loader); None for one loader."""


class PreparedLoader:
    """A dataloader as the loops use it: per-epoch reseeding, resumable position, batch count.

    ``not_resumable`` says why the loader cannot start at a sample index (None when it can).
    """

    def __init__(
        self, loader: DataLoader[Any], seed: int, num_replicas: int, *, not_resumable: str | None = None
    ) -> None:
        self.loader = loader
        self.seed = seed
        self.num_replicas = num_replicas
        self.not_resumable = not_resumable

    def reseed(self, seed: int) -> None:
        """Draw every epoch's order from ``seed`` from now on (the distributed order): a resumed
        run takes the seed its checkpoint recorded (see [Note: reproducible data order])."""
        self.seed = seed
        if isinstance(self.loader.sampler, DistributedSampler):
            self.loader.sampler.seed = seed

    @property
    def resumable(self) -> bool:
        """Whether an epoch can start at any sample of its order (else it is replayed)."""
        return self.not_resumable is None

    def __len__(self) -> int:
        return len(self.loader)

    def has_len(self) -> bool:
        """Whether the number of batches per epoch is known."""
        try:
            len(self.loader)
        except TypeError:
            return False
        return True

    @property
    def order_state(self) -> torch.Tensor | None:
        """The state of the generator that permuted the current epoch (None: no such order)."""
        sampler = self.loader.sampler
        return sampler.order_state if isinstance(sampler, ResumableDistributedSampler) else None

    def iterate(
        self, epoch: int, start: tuple[int, int] = (0, 0), resumed: EpochDraws | None = None
    ) -> Iterator[Any]:
        """An iterator over epoch ``epoch`` from ``start``: (batch index, samples of the epoch's
        order consumed), as :meth:`resume_start` gives it. Made as Lightning makes it, drawing
        from the global generator; ``resumed``: draw instead what the epoch drew when a
        checkpoint recorded it (see [Note: the epoch's draws])."""
        batch, samples = start
        sampler = self.loader.sampler
        if isinstance(sampler, DistributedSampler):
            sampler.set_epoch(epoch)
        if isinstance(sampler, ResumableDistributedSampler):
            sampler.offset, sampler.offset_epoch = samples, epoch
            if resumed is not None and resumed.order_state is not None:
                sampler.resumed_order = (epoch, resumed.order_state)
            return self._new_iterator(resumed, 0)
        return self._new_iterator(resumed, batch)  # not resumable by index: replay the data

    def _new_iterator(self, resumed: EpochDraws | None, replay: int) -> Iterator[Any]:
        """``iter(loader)``, past its first ``replay`` batches. With a recorded global state
        (``resumed``), made and replayed from that state, as the epoch was (its base seed, and a
        sampler of the user's drawing its order), the global generator then put back as it was."""
        if resumed is None or resumed.rng_state is None:
            iterator = iter(self.loader)
            for _ in range(replay):
                next(iterator, None)
            return iterator
        now = torch.get_rng_state()
        torch.set_rng_state(resumed.rng_state)
        try:
            iterator = iter(self.loader)
            for _ in range(replay):
                next(iterator, None)
        finally:
            torch.set_rng_state(now)
        return iterator

    def samples_consumed(self, start: tuple[int, int], batches: int) -> int | None:
        """How many positions of the epoch's order the processes together have consumed after
        ``batches`` batches of an epoch whose run began at ``start``; None when not resumable."""
        sampler = self.loader.sampler
        if not isinstance(sampler, ResumableDistributedSampler):
            return None
        batch, samples = start
        consumed = samples + (batches - batch) * self._batch_size * self.num_replicas
        return min(consumed, sampler.length)

    def resume_start(self, position: SavedPosition, epoch: int) -> tuple[int, int]:
        """Where epoch ``epoch``, left by a checkpoint at ``position``, goes on in this run:
        (batch index, samples of the epoch's order consumed). See
        [Note: resuming at another world size]."""
        sampler = self.loader.sampler
        if not isinstance(sampler, ResumableDistributedSampler):
            self._warn_replay(position, epoch)
            return position.batches, 0
        samples = position.samples
        if samples is None:  # written before checkpoints recorded it: the same prefix rule
            samples = position.batches * self._batch_size * (position.world_size or self.num_replicas)
        samples = min(samples, sampler.length)
        per_rank, size = math.ceil((sampler.length - samples) / self.num_replicas), self._batch_size
        left = per_rank // size if self.loader.drop_last else math.ceil(per_rank / size)
        return len(self.loader) - left, samples

    @property
    def _batch_size(self) -> int:
        return self.loader.batch_size or 1

    def _warn_replay(self, position: SavedPosition, epoch: int) -> None:
        written, now = position.world_size, self.num_replicas
        if not position.batches or written is None or written == now:
            return  # the replay is exact
        batches = position.batches * abs(now - written)
        size = self.loader.batch_size
        amount = f"about {batches * size} samples" if size else f"about {batches} batches"
        effect = "skipped (never trained on)" if now > written else "trained on twice"
        rank_zero_warn(
            f"Resuming epoch {epoch} in its middle on {now} process(es) from a checkpoint written by "
            f"{written}: the training dataloader cannot start at a sample index ({self.not_resumable}), so "
            f"each process skips the first {position.batches} batches it reads, as each did before the "
            f"checkpoint. On {now} instead of {written} processes that covers a different part of the "
            f"epoch: {amount} of epoch {epoch} may be {effect}. To resume exactly, resume on {written} "
            "process(es), or let the Trainer sample the data (a map-style dataset, no custom sampler, "
            "use_distributed_sampler=True), or resume from a checkpoint written at the end of an epoch.",
            stacklevel=2,
        )


def prepare_dataloader(
    loader: Any,
    *,
    shuffle_default: bool,
    num_replicas: int,
    rank: int,
    seed: int,
    name: str,
    distributed: bool = True,
    shuffle: bool | None = None,
    draws_order: bool = False,
) -> PreparedLoader:
    """Check ``loader`` and, for map-style data, rebuild it as in [Note: reproducible data order]
    (unless ``distributed`` is False: then it is used as given). ``shuffle``: whether the rebuilt
    loader shuffles (default: as the given one does); ``draws_order``: shuffle as its
    ``RandomSampler`` would (see :class:`ResumableDistributedSampler`)."""
    if not isinstance(loader, DataLoader):
        raise MisconfigurationError(
            f"{name} must be a torch.utils.data.DataLoader, got {type(loader).__name__}. "
            "Wrap your dataset: DataLoader(dataset, batch_size=...)."
        )
    if isinstance(loader.dataset, IterableDataset):
        return PreparedLoader(loader, seed, num_replicas, not_resumable="its dataset is iterable")
    if not distributed:
        return PreparedLoader(loader, seed, num_replicas, not_resumable="use_distributed_sampler=False")
    sampler = loader.sampler
    if not isinstance(sampler, RandomSampler | SequentialSampler) or not isinstance(
        loader.batch_sampler, BatchSampler
    ):
        if num_replicas > 1 and not isinstance(sampler, DistributedSampler):
            rank_zero_warn(
                f"{name} uses a custom sampler ({type(sampler).__name__}), which the Trainer keeps as is: "
                "every process will read the samples it yields. Make it split the data by rank "
                "(e.g. a DistributedSampler) so processes do not train on the same samples.",
                stacklevel=1,
            )
        own = sampler if isinstance(loader.batch_sampler, BatchSampler) else loader.batch_sampler
        return PreparedLoader(
            loader, seed, num_replicas, not_resumable=f"it has its own sampler, {type(own).__name__}"
        )
    if shuffle is None:
        shuffle = isinstance(sampler, RandomSampler) if sampler is not None else shuffle_default
    new_sampler = ResumableDistributedSampler(
        loader.dataset,
        num_replicas=num_replicas,
        rank=rank,
        shuffle=shuffle,
        seed=seed,
        draws_order=draws_order,
        generator=sampler.generator if isinstance(sampler, RandomSampler) else None,
    )
    rebuilt = DataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        sampler=new_sampler,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=loader.drop_last,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn or (seed_worker if seed_workers_requested() else None),
        multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator,
        prefetch_factor=loader.prefetch_factor,
        persistent_workers=loader.persistent_workers,
    )
    return PreparedLoader(rebuilt, seed, num_replicas)


def limit_batches(limit: int | float, available: int | float, name: str) -> int | float:
    """How many batches to run given a ``limit_*_batches`` setting (int count or float fraction)."""
    if isinstance(limit, bool) or not isinstance(limit, int | float) or limit < 0:
        raise MisconfigurationError(
            f"{name}={limit!r} is invalid: pass a fraction in [0.0, 1.0] or a number of batches (int >= 0)."
        )
    if isinstance(limit, float):
        if limit > 1.0:
            raise MisconfigurationError(
                f"{name}={limit} is a float above 1.0. A float is a fraction of the dataloader (0.0-1.0); "
                f"for a number of batches pass an int, e.g. {name}={int(limit)}."
            )
        if math.isinf(available):
            if limit == 1.0:
                return available
            raise MisconfigurationError(
                f"{name}={limit} is a fraction, but the dataloader has no length (an iterable dataset). "
                f"Pass a number of batches instead, e.g. {name}=100."
            )
        return int(available * limit) if limit < 1.0 else available
    return min(limit, available)
