"""Where a checkpoint's files live, how its completeness is recorded, and how it is checked.

A **full** checkpoint is one file written by ``torch.save`` (a zip archive whose entries carry
CRC-32 checksums computed while writing).

A **sharded** checkpoint is a directory::

    path/
      fullshard-checkpoint.json    the commit record, written last and atomically
      data-<id>/                   one save's files
        .metadata                  torch.distributed.checkpoint's index of the tensors
        __<rank>_<n>.distcp        tensor data written by each rank
        meta.pt                    everything else (loops, schedulers, RNG states, ...)

[Note: directory commit]
A save writes a fresh ``data-<id>`` directory, fsyncs every file, and then atomically replaces
the commit record, which names that directory and lists every file with its size and CRC-32.
Until that rename the record still names the previous save's directory, which was never
touched: a save killed at any moment leaves the previous checkpoint intact. Directories no
record names are leftovers of interrupted saves; the next save removes them.
"""

from __future__ import annotations

import json
import os
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fullshard.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    IncompleteCheckpointError,
)

RECORD_NAME = "fullshard-checkpoint.json"
DATA_PREFIX = "data-"
META_NAME = "meta.pt"
FORMAT_VERSION = 1
_CHUNK = 2**20


def crc32_of(path: Path) -> int:
    """CRC-32 of a file's bytes (about 3 GB/s with zlib)."""
    # One reused buffer: a fresh bytes object per read is a fresh mapping, page-faulted in, under
    # FSDP's fixed mmap threshold (see [Note: CPU memory under FSDP]); that halved the speed.
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    crc = 0
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            crc = zlib.crc32(view[:n], crc)
    return crc


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class CommitRecord:
    """What a sharded checkpoint's ``fullshard-checkpoint.json`` holds."""

    data: str
    files: dict[str, dict[str, int]]
    world_size: int
    strategy: str
    epoch: int
    global_step: int
    fullshard_version: str
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=1, sort_keys=True)

    @classmethod
    def read(cls, directory: Path) -> CommitRecord:
        """Parse the record of ``directory``.

        Raises:
            CorruptCheckpointError: the record exists but cannot be parsed.
        """
        record = directory / RECORD_NAME
        try:
            raw = json.loads(record.read_text())
            return cls(**raw)
        except (ValueError, TypeError) as err:
            raise CorruptCheckpointError(
                f"The commit record {str(record)!r} is damaged ({err}). The checkpoint cannot be trusted; "
                "resume from an earlier one."
            ) from err


Format = Literal["full", "sharded"]


def detect_format(path: str | Path) -> Format:
    """``"full"`` for a checkpoint file, ``"sharded"`` for a committed checkpoint directory.

    Raises:
        CheckpointNotFoundError: nothing is at ``path``, or an empty / unrelated directory.
        IncompleteCheckpointError: a directory whose save was interrupted before its commit.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointNotFoundError(
            f"No checkpoint at {str(path)!r}: the path does not exist. Check the path, or pass "
            "ckpt_path='last' to resume from the newest checkpoint ModelCheckpoint wrote."
        )
    if path.is_file():
        return "full"
    if (path / RECORD_NAME).is_file():
        return "sharded"
    entries = [p.name for p in path.iterdir()]
    if any(name.startswith(DATA_PREFIX) for name in entries):
        raise IncompleteCheckpointError(
            f"The checkpoint directory {str(path)!r} was never completed: its save was interrupted before "
            "the commit record was written. Resume from an earlier checkpoint; the next save to this path "
            "cleans it up."
        )
    if ".metadata" in entries and META_NAME in entries:
        raise CheckpointError(
            f"{str(path)!r} looks like a sharded checkpoint written by Lightning's FSDPStrategy (a "
            f"torch.distributed.checkpoint directory with {META_NAME}, but no {RECORD_NAME}). Turn it into "
            "one file with Lightning's `python -m lightning.pytorch.utilities.consolidate_checkpoint "
            f"{path}` and pass that file: fullshard reads Lightning's single-file checkpoints."
        )
    if ".metadata" in entries:
        raise CheckpointError(
            f"{str(path)!r} is a torch.distributed.checkpoint directory, but not one fullshard wrote (it has no "
            f"{RECORD_NAME}). Load it with torch.distributed.checkpoint.load, or re-save it with fullshard."
        )
    raise CheckpointNotFoundError(
        f"{str(path)!r} is a directory that holds no checkpoint"
        + (" (it is empty)." if not entries else f" (found {', '.join(sorted(entries)[:5])}).")
        + " Pass a checkpoint file or a directory written by Trainer.save_checkpoint()."
    )


def check_sharded_files(directory: Path, record: CommitRecord, verify: bool) -> None:
    """Check every file the record lists: present, the recorded size, and (``verify``) CRC-32.

    Raises:
        CorruptCheckpointError: a file is missing, truncated or (``verify``) altered.
    """
    data = directory / record.data
    problems = []
    for name, info in sorted(record.files.items()):
        file = data / name
        if not file.is_file():
            problems.append(f"{name} is missing")
        elif file.stat().st_size != info["size"]:
            problems.append(f"{name} has {file.stat().st_size} bytes, {info['size']} were written")
        elif verify and crc32_of(file) != info["crc32"]:
            problems.append(f"{name} fails its CRC-32 check (bytes changed after writing)")
    if problems:
        raise CorruptCheckpointError(
            f"The sharded checkpoint {str(directory)!r} is damaged: {'; '.join(problems)}. Resume from an "
            "earlier checkpoint."
        )


def verify_full_file(path: Path) -> None:
    """Check every entry of a checkpoint file against the CRC-32 ``torch.save`` recorded for it.

    ``torch.load`` does not check these, so a flipped byte inside tensor data loads silently.

    Raises:
        CorruptCheckpointError: an entry fails its check, or the file is not a readable archive.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, zlib.error) as err:
        raise CorruptCheckpointError(
            f"The checkpoint file {str(path)!r} is damaged or not a checkpoint ({err}). Resume from an earlier "
            "checkpoint instead."
        ) from err
    if bad is not None:
        raise CorruptCheckpointError(
            f"The checkpoint file {str(path)!r} is damaged: entry {bad!r} fails its CRC-32 check. Resume from "
            "an earlier checkpoint instead."
        )


def verify(path: str | Path) -> Format:
    """Check a checkpoint of either format completely, reading every byte. Returns its format."""
    path = Path(path)
    fmt = detect_format(path)
    if fmt == "full":
        verify_full_file(path)
    else:
        record = CommitRecord.read(path)
        check_sharded_files(path, record, verify=True)
    return fmt


def leftover_data_dirs(directory: Path, keep: str | None) -> list[Path]:
    """Data directories in ``directory`` that the commit record does not name."""
    if not directory.is_dir():
        return []
    return [
        p for p in directory.iterdir() if p.is_dir() and p.name.startswith(DATA_PREFIX) and p.name != keep
    ]
