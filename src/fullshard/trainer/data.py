"""Dataloader preparation: distributed, resumable sampling with a fixed order per epoch.

[Note: reproducible data order]
For map-style datasets the Trainer rebuilds the user's ``DataLoader`` around a
:class:`ResumableDistributedSampler`: the order of each epoch depends only on the seed and
the epoch number, each process reads its own share, and a resumed run can start in the middle
of an epoch by skipping the samples already seen. The rebuilt loader also gets its own
``torch.Generator`` (reseeded per epoch) so that creating its iterator draws nothing from the
global RNG: a resumed run then sees exactly the random numbers an uninterrupted run would.
Iterable datasets and custom samplers are used as given (resuming them mid-epoch is not exact).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from lightning_utilities.core.rank_zero import rank_zero_warn
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
from fullshard.seed import seed_worker, seed_workers_requested


class ResumableDistributedSampler(DistributedSampler[Any]):
    """A ``DistributedSampler`` that can skip the first ``skip`` samples of the current epoch."""

    def __init__(self, dataset: Dataset[Any], **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self.skip = 0
        self.skip_epoch = -1

    def __iter__(self) -> Iterator[Any]:
        indices = list(super().__iter__())
        # only for the epoch being resumed: an iterator that was never advanced (a resumed epoch
        # with nothing left) must not carry the skip over into the next epoch
        skip = self.skip if self.skip_epoch == self.epoch else 0
        self.skip = 0
        return iter(indices[skip:])


class PreparedLoader:
    """A dataloader as the loops use it: per-epoch reseeding, resumable position, batch count."""

    def __init__(self, loader: DataLoader[Any], seed: int, resumable: bool) -> None:
        self.loader = loader
        self.seed = seed
        self.resumable = resumable

    def __len__(self) -> int:
        return len(self.loader)

    def has_len(self) -> bool:
        """Whether the number of batches per epoch is known."""
        try:
            len(self.loader)
        except TypeError:
            return False
        return True

    def iterate(self, epoch: int, skip_batches: int = 0) -> Iterator[Any]:
        """An iterator over epoch ``epoch``, starting after ``skip_batches`` batches."""
        sampler = self.loader.sampler
        if isinstance(sampler, DistributedSampler):
            sampler.set_epoch(epoch)
        if self.loader.generator is not None:
            self.loader.generator.manual_seed(self.seed + epoch)
        if skip_batches and isinstance(sampler, ResumableDistributedSampler):
            batch_size = self.loader.batch_size or 1
            sampler.skip = skip_batches * batch_size
            sampler.skip_epoch = epoch
            return iter(self.loader)
        iterator = iter(self.loader)
        for _ in range(skip_batches):  # not resumable by index: replay the data
            next(iterator, None)
        return iterator


def prepare_dataloader(
    loader: Any,
    *,
    shuffle_default: bool,
    num_replicas: int,
    rank: int,
    seed: int,
    name: str,
    distributed: bool = True,
) -> PreparedLoader:
    """Check ``loader`` and, for map-style data, rebuild it as in [Note: reproducible data order]
    (unless ``distributed`` is False: then it is used as given)."""
    if not isinstance(loader, DataLoader):
        raise MisconfigurationError(
            f"{name} must be a torch.utils.data.DataLoader, got {type(loader).__name__}. "
            "Wrap your dataset: DataLoader(dataset, batch_size=...)."
        )
    if isinstance(loader.dataset, IterableDataset) or not distributed:
        return PreparedLoader(loader, seed, resumable=False)
    sampler = loader.sampler
    if not isinstance(sampler, RandomSampler | SequentialSampler) or not isinstance(
        loader.batch_sampler, BatchSampler
    ):
        if num_replicas > 1 and not isinstance(sampler, DistributedSampler):
            rank_zero_warn(
                f"{name} uses a custom sampler ({type(sampler).__name__}), which the Trainer keeps as is: "
                "every process will read the samples it yields. Make it split the data by rank "
                "(e.g. a DistributedSampler) so processes do not train on the same samples.",
                stacklevel=3,
            )
        return PreparedLoader(loader, seed, resumable=False)
    shuffle = isinstance(sampler, RandomSampler) if sampler is not None else shuffle_default
    new_sampler = ResumableDistributedSampler(
        loader.dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed
    )
    generator = torch.Generator()
    generator.manual_seed(seed)
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
        generator=generator,
        prefetch_factor=loader.prefetch_factor,
        persistent_workers=loader.persistent_workers,
    )
    return PreparedLoader(rebuilt, seed, resumable=True)


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
