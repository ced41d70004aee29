"""``CombinedLoader``: several loaders read together, as Lightning's ``CombinedLoader``.

A dict, list or tuple (nested too) of dataloaders given to ``fit`` is read as
``CombinedLoader(loaders, "max_size_cycle")``: each training step gets one batch of every loader,
in the same structure (``{"a": batch_a, "b": batch_b}``), and the shorter loaders start over
until the longest one ends. The modes:

==================  ==============================================================  ===========
mode                a pass ends                                                     ``len``
==================  ==============================================================  ===========
``max_size_cycle``  with the longest loader; the others start over when they end     longest
``max_size``        with the longest loader; an ended one gives None                longest
``min_size``        with the shortest loader                                        shortest
``sequential``      after every loader in turn; yields ``(batch, batch_idx,          sum
                    dataloader_idx)``
==================  ==============================================================  ===========

``fit`` takes the first three (``sequential`` is refused, as in Lightning); ``validate`` and
``test`` read a list or dict of loaders as ``sequential`` (see [Note: several evaluation
dataloaders] in fullshard.trainer.loops.evaluation_loop) and take the other modes too, a step
then getting the combined batch; ``predict`` takes ``sequential`` only.

[Note: resuming combined loaders]
The Trainer prepares each inner loader as it prepares a single one (its distributed sampler,
resumable by sample index: [Note: reproducible data order] in fullshard.trainer.data). A loader
that starts over in the middle of an epoch reads the epoch's order again, as Lightning's
``iter(loader)`` does (the sampler's epoch did not change). So the position of every inner
loader follows from the combined batch index ``k`` and the inner lengths ``n_i``: ``k % n_i``
batches into its ``k // n_i``-th pass (``max_size_cycle``), ``min(k, n_i)`` (``max_size``) or
``k`` (``min_size``). A checkpoint records each inner loader's position (``loader_positions`` in
its ``"loops"`` entry); a resumed run starts each inner loader there, by the single loader's
mechanism, and so reads exactly the batches the uninterrupted run would, on as many processes as
wrote the checkpoint (on another number the inner lengths differ: it warns, and goes on from the
same combined batch index).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from torch.utils.data import DataLoader

from fullshard.errors import MisconfigurationError
from fullshard.rank_zero import rank_zero_warn
from fullshard.trainer.data import EpochDraws, PreparedLoader, SavedPosition

MODES = ("min_size", "max_size_cycle", "max_size", "sequential")


# ------------------------------------------------------------------------- the structure
def flatten(iterables: Any) -> tuple[list[Any], Callable[[list[Any]], Any]]:
    """The leaves of a (nested) dict, list or tuple, in order, and a function that puts a list
    of as many values back into that structure; anything else is one leaf."""
    children = list(iterables.values()) if isinstance(iterables, Mapping) else iterables
    if isinstance(iterables, Mapping | list | tuple) and all(
        isinstance(c, int | float | str) for c in children
    ):
        return [iterables], lambda values: values[0]  # a container of plain values is one leaf (Lightning's)
    if isinstance(iterables, Mapping):
        keys = list(iterables)
        parts = [flatten(iterables[k]) for k in keys]
        cls: Any = type(iterables)
        kind: Callable[[list[Any]], Any] = lambda vs: cls(zip(keys, vs, strict=True))  # noqa: E731
    elif isinstance(iterables, list | tuple):
        parts = [flatten(v) for v in iterables]
        kind = (lambda vs: type(iterables)(*vs)) if hasattr(iterables, "_fields") else type(iterables)
    else:
        return [iterables], lambda values: values[0]
    leaves = [leaf for part_leaves, _ in parts for leaf in part_leaves]
    sizes = [len(part_leaves) for part_leaves, _ in parts]

    def rebuild(values: list[Any]) -> Any:
        out, at = [], 0
        for (_, put), size in zip(parts, sizes, strict=True):
            out.append(put(values[at : at + size]))
            at += size
        return kind(out)

    return leaves, rebuild


def _length(iterable: Any) -> int | float:
    try:
        return len(iterable)
    except (TypeError, NotImplementedError):
        return float("inf")


def combined_length(mode: str, lengths: list[int | float]) -> int | float:
    """Batches of one pass of ``mode`` over loaders of ``lengths`` (inf: unknown)."""
    if not lengths:
        return 0
    if mode == "min_size":
        return min(lengths)
    if mode == "sequential":
        return sum(lengths)
    return max(lengths)


# ------------------------------------------------------------------------ the iteration
def combine(
    mode: str, start: Sequence[Callable[[], Iterator[Any]]], restart: Sequence[Callable[[], Iterator[Any]]]
) -> Iterator[list[Any]]:
    """The combined batches (lists, one value per loader) of ``mode`` (not ``sequential``):
    ``start[i]()`` makes loader ``i``'s iterator, ``restart[i]()`` a new one when it ended
    (``max_size_cycle``)."""
    iterators = [make() for make in start]
    if not iterators:
        return iter(())
    if mode == "min_size":
        return _min_size(iterators)
    if mode == "max_size":
        return _max_size(iterators)
    return _max_size_cycle(iterators, restart)


def _min_size(iterators: list[Iterator[Any]]) -> Iterator[list[Any]]:
    while True:
        try:
            out = [next(iterator) for iterator in iterators]
        except StopIteration:  # the shortest ended
            return
        yield out


def _max_size(iterators: list[Iterator[Any]]) -> Iterator[list[Any]]:
    while True:
        out: list[Any] = [None] * len(iterators)  # an ended loader gives None
        produced = False
        for i, iterator in enumerate(iterators):
            with contextlib.suppress(StopIteration):
                out[i], produced = next(iterator), True
        if not produced:  # they all ended
            return
        yield out


def _max_size_cycle(
    iterators: list[Iterator[Any]], restart: Sequence[Callable[[], Iterator[Any]]]
) -> Iterator[list[Any]]:
    ended = [False] * len(iterators)
    while True:
        out: list[Any] = [None] * len(iterators)
        for i in range(len(iterators)):
            try:
                out[i] = next(iterators[i])
            except StopIteration:
                ended[i] = True
                if all(ended):  # the longest ended (each ended once)
                    return
                iterators[i] = restart[i]()  # start it over
                out[i] = next(iterators[i])
        yield out


class CombinedLoader(Iterable[Any]):
    """Several iterables read together (see the module's table of modes), as Lightning's
    ``CombinedLoader``: iterating yields ``(batch, batch_idx, dataloader_idx)``, ``batch`` in the
    structure of ``iterables`` (``sequential``: the batch of one loader at a time). ``len`` is
    known after ``iter`` (capped by :attr:`limits`, one per loader, when set)."""

    def __init__(self, iterables: Any, mode: str = "min_size") -> None:
        if mode not in MODES:
            raise ValueError(f"Unsupported mode {mode!r}, please select one of: {list(MODES)}.")
        self._iterables = iterables
        self._flattened, self._rebuild = flatten(iterables)
        self._mode = mode
        self._limits: list[int | float] | None = None
        self._iterator: Iterator[tuple[Any, int, int]] | None = None

    @property
    def mode(self) -> str:
        return self._mode

    @property
    def iterables(self) -> Any:
        """The iterables as given."""
        return self._iterables

    @property
    def flattened(self) -> list[Any]:
        """The iterables as a flat list, in order."""
        return self._flattened

    @flattened.setter
    def flattened(self, flattened: list[Any]) -> None:
        if len(flattened) != len(self._flattened):
            raise ValueError(
                f"Mismatch in flattened length ({len(flattened)}) and existing length ({len(self._flattened)})"
            )
        self._iterables = self._rebuild(list(flattened))
        self._flattened = list(flattened)

    @property
    def sampler(self) -> Any:
        """The iterables' samplers, in their structure."""
        return self._rebuild([getattr(x, "sampler", None) for x in self._flattened])

    @property
    def batch_sampler(self) -> Any:
        """The iterables' batch samplers, in their structure."""
        return self._rebuild([getattr(x, "batch_sampler", None) for x in self._flattened])

    @property
    def limits(self) -> list[int | float] | None:
        """The most batches to read of each iterable (None: all)."""
        return self._limits

    @limits.setter
    def limits(self, limits: int | float | list[int | float] | None) -> None:
        if isinstance(limits, int | float):
            limits = [limits] * len(self._flattened)
        elif isinstance(limits, list) and len(limits) != len(self._flattened):
            raise ValueError(
                f"Mismatch in number of limits ({len(limits)}) and number of iterables ({len(self._flattened)})"
            )
        self._limits = limits

    def lengths(self) -> list[int | float]:
        """Each iterable's number of batches (inf: unknown), capped by its limit."""
        lengths = [_length(x) for x in self._flattened]
        if self._limits is None:
            return lengths
        return [min(n, limit) for n, limit in zip(lengths, self._limits, strict=True)]

    def __iter__(self) -> CombinedLoader:
        self._iterator = self._sequential() if self._mode == "sequential" else self._together()
        return self

    def __next__(self) -> tuple[Any, int, int]:
        if self._iterator is None:
            raise RuntimeError("Please call `iter(combined_loader)` first.")
        return next(self._iterator)

    def __len__(self) -> int:
        if self._iterator is None:
            raise RuntimeError("Please call `iter(combined_loader)` first.")
        length = combined_length(self._mode, self.lengths())
        if not isinstance(length, int):
            raise TypeError(f"{type(self).__name__} has no length: one of its iterables has none.")
        return length

    def reset(self) -> None:
        """Forget the iterator (a dataloader's worker processes end with it)."""
        self._iterator = None

    def _together(self) -> Iterator[tuple[Any, int, int]]:
        makers = [functools.partial(iter, x) for x in self._flattened]
        for index, values in enumerate(combine(self._mode, makers, makers)):
            yield self._rebuild(values), index, 0

    def _sequential(self) -> Iterator[tuple[Any, int, int]]:
        limits = self._limits or [float("inf")] * len(self._flattened)
        for loader_idx, (iterable, limit) in enumerate(zip(self._flattened, limits, strict=True)):
            if limit <= 0:
                continue
            for index, batch in enumerate(iterable):
                yield batch, index, loader_idx
                if index + 1 >= limit:
                    break


def as_combined(loaders: Any, default_mode: str) -> CombinedLoader | None:
    """``loaders`` as a :class:`CombinedLoader`: itself, or a dict/list/tuple of dataloaders in
    ``default_mode``; None for one dataloader (or anything else, which the caller refuses)."""
    if isinstance(loaders, CombinedLoader):
        return loaders
    if isinstance(loaders, Mapping | list | tuple):
        return CombinedLoader(loaders, default_mode)
    return None


def check_loaders(combined: CombinedLoader, argument: str) -> None:
    """Every iterable of ``combined`` must be a ``DataLoader``."""
    if not combined.flattened:
        raise _error(argument, "an empty collection", "Pass at least one dataloader.")
    if combined.flattened == [combined.iterables] and not isinstance(combined.iterables, DataLoader):
        fix = "Wrap your dataset: DataLoader(dataset, batch_size=...)."
        raise _error(argument, type(combined.iterables).__name__, fix)  # a list of numbers, say
    for item in combined.flattened:
        if not isinstance(item, DataLoader):
            raise _error(
                argument,
                f"a {type(item).__name__} among them",
                "Wrap each dataset: DataLoader(dataset, batch_size=...).",
            )


def _error(argument: str, got: str, fix: str) -> Exception:
    return MisconfigurationError(
        f"{argument} must be a torch.utils.data.DataLoader, a CombinedLoader, or a dict, list or tuple of "
        f"dataloaders; got {got}. {fix}"
    )


def warn_other_world_size(written: int | None, now: int) -> None:
    """A combined loader resumed on another number of processes (see [Note: resuming combined loaders])."""
    if written is None or written == now:
        return
    rank_zero_warn(
        f"Resuming a CombinedLoader's epoch in its middle on {now} process(es) from a checkpoint written by "
        f"{written}: its loaders have other lengths here, so the epoch goes on from the same batch index with "
        "each loader at the position that index gives here, not exactly where each one was. Resume on "
        f"{written} process(es), or from a checkpoint written at the end of an epoch, to resume exactly.",
        stacklevel=2,
    )


# ------------------------------------------------------------------- as the loops read it
class PreparedCombined:
    """A :class:`CombinedLoader` as the loops use it: each inner loader prepared as a single
    one is (:class:`~fullshard.trainer.data.PreparedLoader`), read together in its mode,
    resumable at any combined batch (see [Note: resuming combined loaders]). It answers what the
    loops ask of a ``PreparedLoader``."""

    def __init__(self, combined: CombinedLoader, loaders: list[PreparedLoader]) -> None:
        self.mode = combined.mode
        self.loaders = loaders
        self._rebuild = flatten(combined.iterables)[1]
        self._resume: tuple[int, int, list[tuple[int, int]]] | None = None  # epoch, batch, positions

    @property
    def loader(self) -> Any:
        """The inner dataloaders, as the loops read them, in the structure given (Lightning's
        ``trainer.train_dataloader`` of a CombinedLoader)."""
        return self._rebuild([p.loader for p in self.loaders])

    @property
    def seed(self) -> int:
        return self.loaders[0].seed

    def reseed(self, seed: int) -> None:
        for prepared in self.loaders:
            prepared.reseed(seed)

    @property
    def not_resumable(self) -> str | None:
        return next((p.not_resumable for p in self.loaders if p.not_resumable is not None), None)

    @property
    def resumable(self) -> bool:
        return self.not_resumable is None

    def _lengths(self) -> list[int | float]:
        return [len(p) if p.has_len() else float("inf") for p in self.loaders]

    def __len__(self) -> int:
        length = combined_length(self.mode, self._lengths())
        if not isinstance(length, int):
            raise TypeError("A CombinedLoader with a loader without a length has no length.")
        return length

    def has_len(self) -> bool:
        return isinstance(combined_length(self.mode, self._lengths()), int)

    def lengths(self) -> list[int | float]:
        """Each inner loader's batches per epoch (inf: unknown)."""
        return self._lengths()

    def positions(self, batches: int) -> list[tuple[int, int]]:
        """Where each inner loader is after ``batches`` combined batches of an epoch: (batches
        into its current pass, passes it started over); see [Note: resuming combined loaders]."""
        out = []
        for length in self._lengths():
            if self.mode == "max_size_cycle" and length and not isinstance(length, float):
                out.append((batches % length, batches // length))
            elif self.mode == "max_size":
                out.append((int(min(batches, length)), 0))
            else:
                out.append((batches, 0))
        return out

    def state(self, batches: int) -> list[dict[str, int | None]]:
        """The inner loaders' positions after ``batches`` combined batches, as a checkpoint
        records them (``samples``: positions of the inner loader's epoch order consumed)."""
        return [
            {"batches": at, "cycles": cycles, "samples": prepared.samples_consumed((0, 0), at)}
            for prepared, (at, cycles) in zip(self.loaders, self.positions(batches), strict=True)
        ]

    @property
    def order_state(self) -> None:
        """None: the inner loaders keep the seeded order, which a resumed run draws again."""
        return None

    def iterate(
        self, epoch: int, start: tuple[int, int] = (0, 0), resumed: EpochDraws | None = None
    ) -> Iterator[Any]:
        """The combined batches of epoch ``epoch`` from combined batch ``start[0]`` (``resumed``:
        not used, see :attr:`order_state`)."""
        batch = start[0]
        if self._resume is not None and self._resume[:2] == (epoch, batch):
            at = self._resume[2]
        else:
            at = [
                (p, prepared.samples_consumed((0, 0), p) or 0)
                for prepared, (p, _) in zip(self.loaders, self.positions(batch), strict=True)
            ]
        self._resume = None
        starts = [functools.partial(p.iterate, epoch, s) for p, s in zip(self.loaders, at, strict=True)]
        again = [functools.partial(p.iterate, epoch, (0, 0)) for p in self.loaders]
        for values in combine(self.mode, starts, again):
            yield self._rebuild(values)

    def samples_consumed(self, start: tuple[int, int], batches: int) -> int | None:
        """None: the inner loaders' own positions are recorded instead (:meth:`state`)."""
        return None

    def resume_start(self, position: SavedPosition, epoch: int) -> tuple[int, int]:
        """Where epoch ``epoch``, left at ``position``, goes on: the same combined batch, each
        inner loader where the checkpoint recorded it."""
        warn_other_world_size(position.world_size, self.loaders[0].num_replicas)
        saved = position.loaders
        if saved is not None and len(saved) == len(self.loaders):
            self._resume = (epoch, position.batches, [(b, s or 0) for b, s in saved])
        return position.batches, 0
