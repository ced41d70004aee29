"""Which dataset indices each predicted batch holds, for a ``BasePredictionWriter``.

As Lightning does, the indices are recorded as the dataloader draws them: the loader is rebuilt
(once per ``predict`` call, only when a writer is among the callbacks) around a batch sampler
that keeps each batch of indices it yields. The batch index looks them up, so workers that
prefetch batches ahead of the loop do not shift them. Each process records its own share (the
distributed sampler's split).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sized
from typing import Any

from torch.utils.data import DataLoader, DistributedSampler, IterableDataset
from typing_extensions import override

from fullshard.rank_zero import rank_zero_warn
from fullshard.trainer.callbacks.prediction_writer import BasePredictionWriter
from fullshard.trainer.data import EpochDraws, PreparedLoader


def prediction_writers(callbacks: Iterable[Any]) -> list[BasePredictionWriter]:
    """The ``BasePredictionWriter`` callbacks among ``callbacks``."""
    return [cb for cb in callbacks if isinstance(cb, BasePredictionWriter)]


class _RecordingBatchSampler:
    """A batch sampler that keeps each batch of indices it yields."""

    def __init__(self, batch_sampler: Iterable[list[int]]) -> None:
        self.batch_sampler = batch_sampler
        self.seen: list[list[int]] = []

    def __len__(self) -> int:
        assert isinstance(self.batch_sampler, Sized)
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator[list[int]]:
        self.seen = []
        for batch in self.batch_sampler:
            self.seen.append(list(batch))
            yield batch


class BatchIndexRecorder(PreparedLoader):
    """A prepared prediction loader that records the dataset indices of its batches."""

    def __init__(self, prepared: PreparedLoader, recording: _RecordingBatchSampler) -> None:
        loader = prepared.loader
        rebuilt: DataLoader[Any] = DataLoader(
            loader.dataset,
            batch_sampler=recording,  # type: ignore[arg-type]
            num_workers=loader.num_workers,
            collate_fn=loader.collate_fn,
            pin_memory=loader.pin_memory,
            timeout=loader.timeout,
            worker_init_fn=loader.worker_init_fn,
            multiprocessing_context=loader.multiprocessing_context,
            generator=loader.generator,
            prefetch_factor=loader.prefetch_factor,
            persistent_workers=loader.persistent_workers,
        )
        super().__init__(
            rebuilt, prepared.seed, prepared.num_replicas, not_resumable="it records its batch indices"
        )
        self.original = loader
        self.recording = recording

    @classmethod
    def wrap(cls, prepared: PreparedLoader) -> PreparedLoader:
        """``prepared`` recording its batch indices; as it is (with a warning) when it draws
        no batches of indices (an iterable dataset, or ``batch_size=None``)."""
        loader = prepared.loader
        if isinstance(loader.dataset, IterableDataset) or loader.batch_sampler is None:
            rank_zero_warn(
                "A BasePredictionWriter gets no batch_indices from a prediction dataloader "
                f"({'an iterable dataset' if isinstance(loader.dataset, IterableDataset) else 'batch_size=None'}): "
                "they are empty lists, as in Lightning."
            )
            return prepared
        return cls(prepared, _RecordingBatchSampler(loader.batch_sampler))

    @override
    def iterate(
        self, epoch: int, start: tuple[int, int] = (0, 0), resumed: EpochDraws | None = None
    ) -> Iterator[Any]:
        """An iterator over the whole epoch ``epoch`` (a prediction run never resumes), drawing
        as the loader it wraps would ([Note: the epoch's draws] in fullshard.trainer.data)."""
        sampler = self.original.sampler
        if isinstance(sampler, DistributedSampler):
            sampler.set_epoch(epoch)
        return iter(self.loader)

    def indices(self, batch_idx: int) -> list[int]:
        """The dataset indices of batch ``batch_idx`` of the current iteration."""
        seen = self.recording.seen
        return seen[batch_idx] if batch_idx < len(seen) else []
