"""The steps of a sharded save that both its paths run: the synchronous one (``engine.py``) and the
background one (``async_save.py``).

1. :func:`write_shards` (every rank): this rank's tensors into the save's fresh data directory with
   ``torch.distributed.checkpoint`` (rank 0 also writes DCP's ``.metadata``), fsynced, and its
   rank record beside them (their sizes and CRC-32s);
2. the caller's agreement that every rank succeeded: a fixed size per rank;
3. :func:`commit_sharded` (rank 0): ``meta.pt``, the fsyncs, and the commit record renamed into
   place.

See [Note: directory commit] in layout.py.

[Note: DCP's finish returns the index to every rank]
``torch.distributed.checkpoint.save`` ends with ``_DistWrapper.all_reduce("write", ...)``
(torch 2.13: ``state_dict_saver.py``, ``_save_state_dict``): every rank's write results (one per
tensor chunk it wrote) are gathered on rank 0, which merges them into the index and writes
``.metadata`` (``FileSystemWriter.finish``); then ``all_reduce`` broadcasts what the finish step
returned, the whole index, ranks x tensors chunk entries, to every rank
(``utils.py``, ``final_result = self.broadcast_object(result)``), where ``save`` returns it. Nothing
of fullshard reads it. :class:`ShardWriter` empties it once ``.metadata`` is written, so the
broadcast carries an empty index: each rank receives a few hundred bytes instead of the index, and
rank 0 pickles it once (for the file), not twice. The gather on rank 0 stays: one index of every
chunk is the format DCP loads from at any world size (``use_collectives=False`` writes one index per
rank instead, which plain DCP only loads at the world size that wrote it).
"""

from __future__ import annotations

import dataclasses
import shutil
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from typing_extensions import override

from fullshard.checkpoint.events import checkpoint_event
from fullshard.checkpoint.io import atomic_write_text, remove_file_leftovers
from fullshard.checkpoint.layout import (
    META_NAME,
    PARSED_BY_RANK0,
    RECORD_NAME,
    CommitRecord,
    Files,
    crc32_of,
    fsync_file,
    leftover_data_dirs,
    write_rank_record,
)
from fullshard.errors import CheckpointError

if TYPE_CHECKING:
    from fullshard.checkpoint.host import CheckpointHost


class ShardWriter(FileSystemWriter):
    """DCP's file writer, signalling when this rank's tensor files are on disk (see events), not
    sending the index back to every rank ([Note: DCP's finish returns the index to every rank]),
    and writing the save's identity into the index: the name of its data directory, as
    ``storage_meta.save_id`` ([Note: one save, one identity] in layout.py)."""

    @override
    def storage_meta(self) -> StorageMeta | None:
        meta = super().storage_meta()
        if meta is not None:
            meta.save_id = Path(self.path).name
        return meta

    @override
    def write_data(self, plan: Any, planner: Any) -> Any:
        future = super().write_data(plan, planner)
        future.wait()
        checkpoint_event("sharded.data_written")
        return future

    @override
    def finish(self, metadata: Metadata, results: Any) -> None:
        super().finish(metadata, results)  # writes .metadata (rank 0)
        # what DCP broadcasts next to every rank, and save() returns (fullshard ignores it)
        metadata.state_dict_metadata = {}
        metadata.storage_data = {}
        metadata.planner_data = {}


def record_of(host: CheckpointHost, checkpoint: dict[str, Any], data_name: str) -> CommitRecord:
    """The commit record of this save, its ``files`` still to be filled in by :func:`commit_sharded`."""
    loops = checkpoint.get("loops", {})
    return CommitRecord(
        data=data_name,
        files={},
        world_size=host.world_size,
        strategy=checkpoint.get("strategy", type(host).__name__),
        epoch=int(loops.get("epoch", 0)),
        global_step=int(loops.get("global_step", 0)),
        fullshard_version=str(checkpoint.get("fullshard_version", "")),
        rank_records=host.world_size,
    )


def write_shards(state: dict[str, Any], data: Path, rank: int, step: int, group: Any, no_dist: bool) -> None:
    """Write this rank's tensors into ``data`` with DCP (collective over ``group``, the default
    group when None), fsync them, and write this rank's record of their sizes and CRC-32s and of
    the save's identity (``data``'s name and ``step``)."""
    # DCP would fsync each file before returning; we fsync them ourselves, beside the CRC-32s
    # (see fsync_and_checksum). .metadata is fsynced in commit_sharded, like meta.pt.
    dcp_save(
        state,
        storage_writer=ShardWriter(data, single_file_per_rank=True, sync_files=False),
        process_group=group,
        no_dist=no_dist,
    )
    checkpoint_event("sharded.metadata_written")
    write_rank_record(data, rank, fsync_and_checksum(sorted(data.glob(f"__{rank}_*.distcp"))), step=step)


def commit_sharded(path: Path, record: CommitRecord, write_meta: Callable[[Path], None]) -> None:
    """On rank 0, once every rank's tensor files and rank record are written and fsynced: write
    ``meta.pt``, fsync what is not yet, and rename the commit record into place."""
    data = path / record.data
    write_meta(data / META_NAME)
    files: Files = {}
    for name in PARSED_BY_RANK0:
        fsync_file(data / name)
        files[name] = {"size": (data / name).stat().st_size, "crc32": crc32_of(data / name)}
    fsync_file(data)  # the directory: every rank's files and records are in it
    record = dataclasses.replace(record, files=files)
    atomic_write_text(record.to_json(), path / RECORD_NAME, before_rename="sharded.before_commit")
    checkpoint_event("sharded.after_commit")
    for old in leftover_data_dirs(path, keep=record.data):
        remove_tree(old)
    remove_file_leftovers(path, RECORD_NAME)


def names_data(path: Path, data_name: str) -> bool:
    """Whether the commit record at ``path`` names the data directory ``data_name``."""
    try:
        return CommitRecord.read(path).data == data_name
    except (CheckpointError, OSError):
        return False


def write_bytes(data: bytes, target: Path) -> None:
    """Write ``data`` to a file of a data directory no commit record names yet (nothing to
    replace atomically); commit_sharded fsyncs it."""
    with open(target, "wb") as f:
        f.write(data)


def fsync_and_checksum(files: Sequence[Path]) -> Files:
    """Fsync each file; return the size and CRC-32 of each.

    The fsyncs run in a thread while the CRC-32s are computed: one waits for the disk, the other
    reads the page cache, so together they take about as long as the slower of the two.
    """

    errors: list[OSError] = []

    def sync() -> None:
        try:
            for file in files:
                fsync_file(file)
        except OSError as err:
            errors.append(err)

    # a plain thread, not a ThreadPoolExecutor: a background save may still be here while the
    # process exits, when concurrent.futures refuses new work (see _wait_at_exit in async_save.py)
    syncing = threading.Thread(target=sync, name="fullshard-fsync", daemon=True)
    syncing.start()
    try:
        sums = {file.name: {"size": file.stat().st_size, "crc32": crc32_of(file)} for file in files}
    finally:
        syncing.join()
    if errors:
        raise errors[0]  # the fsync's error fails the save
    return sums


def remove_tree(directory: Path) -> None:
    """Remove a data directory and what it holds, as far as possible."""
    shutil.rmtree(directory, ignore_errors=True)
