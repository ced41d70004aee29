"""Reading a sharded checkpoint's DCP files without running code from them (see [Note: loading
without running code] in trust.py).

DCP unpickles two things with no restriction: its ``.metadata`` index (``pickle.load`` in
``FileSystemReader.read_metadata``, on every rank that loads) and each non-tensor value, stored
as ``torch.save`` bytes (``torch.load(weights_only=False)`` in ``DefaultLoadPlanner.load_bytes``,
for any entry the index declares as bytes, whatever the template holds there). :class:`SafeReader`
and :func:`load_planner` replace both with fullshard's gates; with ``trust`` they are DCP's own.
Subclassing DCP's reader and planners is the public way to change how they read; their bodies
follow torch 2.13's (``set_element``, ``_get_metadata_path`` and ``_EmptyStateDictLoadPlanner``
are private: used here and in tools.py only).
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from fullshard.checkpoint.index_checks import check_index
from fullshard.checkpoint.io import load_torch_file
from fullshard.checkpoint.trust import MetadataUnpickler
from fullshard.errors import CheckpointError, CorruptCheckpointError, UntrustedCheckpointError


class SafeReader(FileSystemReader):
    """DCP's file reader, whose index is the ``.metadata`` it unpickled through
    :class:`~fullshard.checkpoint.trust.MetadataUnpickler` when it was made (``trust``: as DCP
    reads it), and checked (:func:`~fullshard.checkpoint.index_checks.check_index`, with
    ``save_id`` and ``recorded``: see there), trusted or not.

    Read up front, not in DCP's ``read_metadata`` call: DCP takes a failure there for a missing
    index and falls back to a rank's own ``__<rank>.metadata`` (which fullshard never writes),
    hiding the refusal in an ``AssertionError``.

    Raises:
        UntrustedCheckpointError: (not ``trust``) the index names a global that is not DCP's.
        CorruptCheckpointError: the index points outside the checkpoint or claims what cannot be.
    """

    def __init__(
        self,
        path: str | Path,
        trust: bool = False,
        *,
        save_id: str | None = None,
        recorded: Mapping[str, Mapping[str, int]] | None = None,
    ) -> None:
        super().__init__(str(path))
        self._metadata = self._read(trust)
        check_index(self._metadata, Path(path), save_id=save_id, recorded=recorded)

    def _read(self, trust: bool) -> Metadata:
        # what FileSystemReader.read_metadata does (torch 2.13), with the restricted unpickler in
        # place of pickle.load unless trusted: there is no hook for the unpickler alone
        path = self._get_metadata_path()
        with self.fs.create_stream(path, "rb") as stream:
            metadata = pickle.load(stream) if trust else MetadataUnpickler(stream, os.fspath(path)).load()
        if not isinstance(metadata, Metadata):
            raise CorruptCheckpointError(
                f"The checkpoint file {str(path)!r} holds a {type(metadata).__name__}, not torch.distributed."
                "checkpoint's index (Metadata). Resume from an earlier checkpoint."
            )
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        return metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:
            raise CheckpointError("fullshard's checkpoints have no per-rank index; its .metadata was read")
        self._metadata.storage_meta.load_id = self.load_id  # type: ignore[union-attr]
        return self._metadata


class _SafeBytes:
    """A load planner mixin: the non-tensor values DCP stored with ``torch.save`` are read with
    :func:`~fullshard.checkpoint.io.load_torch_file` (DCP's own ``load_bytes`` uses
    ``weights_only=False``); the rest of ``load_bytes`` is DefaultLoadPlanner's (torch 2.13)."""

    data: Path
    flatten_state_dict: bool
    original_state_dict: Any
    mappings: Any
    state_dict: Any

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        from torch.distributed.checkpoint._traverse import set_element  # private, as load_bytes uses it

        fqn = read_item.dest_index.fqn
        obj = load_torch_file(value, f"{self.data} (entry {fqn!r})")
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj


class _SafeLoadPlanner(_SafeBytes, DefaultLoadPlanner):
    pass


class _SafeEmptyPlanner(_SafeBytes, _EmptyStateDictLoadPlanner):
    pass


def load_planner(data: Path, trust: bool, *, empty: bool = False, keys: set[str] | None = None) -> Any:
    """The load planner for the DCP directory ``data``: DCP's default one, or (``empty``) the one
    that builds the state from the index alone (for the keys ``keys``, all when None); unless
    ``trust``, reading non-tensor values through fullshard's gate."""
    if trust:
        return _EmptyStateDictLoadPlanner(keys=keys) if empty else DefaultLoadPlanner()
    planner = _SafeEmptyPlanner(keys=keys) if empty else _SafeLoadPlanner()
    planner.data = data
    return planner


def read_metadata(
    data: Path,
    trust: bool = False,
    *,
    save_id: str | None = None,
    recorded: Mapping[str, Mapping[str, int]] | None = None,
) -> Metadata:
    """The ``.metadata`` index of the DCP directory ``data``, read and checked through :class:`SafeReader`."""
    return SafeReader(data, trust, save_id=save_id, recorded=recorded).read_metadata()


@contextlib.contextmanager
def untrusted_raised() -> Iterator[None]:
    """Raise the :class:`UntrustedCheckpointError` (else the other checkpoint error: a damaged
    value) a DCP load gathered into its ``CheckpointException`` (on every rank: DCP gives every
    rank every rank's failures) as itself: one from a non-tensor value (:func:`load_planner`)."""
    try:
        yield
    except CheckpointException as err:
        failures = [failure for failure, _ in err.failures.values() if isinstance(failure, CheckpointError)]
        untrusted = [failure for failure in failures if isinstance(failure, UntrustedCheckpointError)]
        if failures:
            raise (untrusted or failures)[0] from None
        raise
