"""DCP's index (``.metadata``) of a sharded checkpoint, checked before a byte it points to is read.

[Note: an index is believed only within bounds]
``torch.distributed.checkpoint`` reads a checkpoint where its index says: each tensor's shape and
dtype, its chunks, and for each chunk a file name, an offset and a length. DCP believes all of it:
a name such as ``../../other/__0_0.distcp`` or ``/dev/zero`` is opened as given, a FIFO blocks the
load forever, a shape of (10**12, 4) is allocated (``torch.empty``) before anything says it cannot
be, a shape nobody's chunks cover is handed back as uninitialised memory. So every index fullshard
reads goes through :func:`check_index` first, on every rank that reads it, and anything outside
these bounds raises :class:`~fullshard.errors.CorruptCheckpointError` naming the entry:

- every storage entry names a tensor file of the checkpoint itself: a plain name
  ``__<rank>_<n>.distcp`` in its data directory (no ``/``, no ``..``, no absolute path), a regular
  file (a symbolic link to one is followed only inside the checkpoint directory: [Note: a
  checkpoint reads only its own directory] in layout.py), and, where the
  caller has read the rank records, one that a rank record lists (so its bytes are under a CRC-32);
  offset and length are non-negative and end within the file's real size; no storage transform
  (compression, encryption: fullshard writes none);
- every tensor has a dtype fullshard writes, a shape of non-negative sizes, chunks inside that
  shape that together cover it exactly, and for each chunk a storage entry at least as long as its
  bytes (and at most :data:`FRAMING` longer: the ``torch.save`` framing DCP wraps around a chunk);
  so the memory a load allocates is bounded by the bytes the checkpoint's files really hold;
- (format 3) the index is the save's named by the commit record (``storage_meta.save_id``,
  [Note: one save, one identity] in layout.py).

The checks read the index and ``stat`` each file once: nothing that grows with the tensors' bytes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)

from fullshard.checkpoint.layout import SHARD_FILE, file_kind
from fullshard.checkpoint.links import link_problem
from fullshard.errors import CorruptCheckpointError

# the dtypes a fullshard checkpoint's tensors can have: torch's plain numeric ones
_DTYPE_NAMES = (
    "float64", "float32", "float16", "bfloat16", "complex128", "complex64", "int64", "int32", "int16", "int8",
    "uint8", "uint16", "uint32", "uint64", "bool", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
    "float8_e5m2fnuz",
)  # fmt: skip
WRITTEN_DTYPES = frozenset(d for n in _DTYPE_NAMES if isinstance(d := getattr(torch, n, None), torch.dtype))
FRAMING = 1 << 20  # bytes a chunk's storage entry may hold beyond its data: torch.save's zip framing
_SHOWN = 5  # problems named in one error; the count says how many more


def check_index(
    metadata: Metadata,
    data: Path,
    *,
    save_id: str | None = None,
    recorded: Mapping[str, Mapping[str, int]] | None = None,
) -> None:
    """Check the index ``metadata`` of the data directory ``data`` (see [Note: an index is
    believed only within bounds]): ``save_id``, the identity every format 3 index carries;
    ``recorded``, the files the records list (name -> recorded size and CRC-32), where read.

    Raises:
        CorruptCheckpointError: naming the entries out of bounds; nothing was read through it.
    """
    problems: list[str] = []
    if save_id is not None:
        found = getattr(metadata.storage_meta, "save_id", None)
        if found != save_id:
            problems.append(f"it belongs to another save ({found!r}; this checkpoint is {save_id!r})")
    sizes: dict[str, int | None] = {}  # file name -> real size (None: unusable), stat'ed once
    storage = metadata.storage_data if isinstance(metadata.storage_data, dict) else {}
    if not isinstance(metadata.storage_data, dict):
        problems.append("its storage entries are no mapping")
    for index, info in storage.items():
        problems += _storage_problems(index, info, data, sizes, recorded)
    entries = metadata.state_dict_metadata if isinstance(metadata.state_dict_metadata, dict) else {}
    for fqn, entry in entries.items():
        problems += _entry_problems(fqn, entry, storage)
    if problems:
        more = f"; and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else ""
        raise CorruptCheckpointError(
            f"The index {str(data / '.metadata')!r} of the sharded checkpoint {str(data.parent)!r} claims what "
            f"cannot be: {'; '.join(problems[:_SHOWN])}{more}. Nothing was read through it. The checkpoint was "
            "damaged or edited after it was written: resume from another checkpoint."
        )


def _storage_problems(
    index: Any,
    info: Any,
    data: Path,
    sizes: dict[str, int | None],
    recorded: Mapping[str, Mapping[str, int]] | None,
) -> list[str]:
    """What is wrong with one storage entry: where a chunk's bytes are."""
    name = getattr(info, "relative_path", None)
    offset, length = getattr(info, "offset", None), getattr(info, "length", None)
    where = f"the storage entry of {getattr(index, 'fqn', index)!r}"
    if not isinstance(name, str) or SHARD_FILE.fullmatch(name) is None:
        return [
            f"{where} names {name!r}, not a tensor file of the checkpoint's data directory (__<rank>_<n>.distcp)"
        ]
    if recorded is not None and name not in recorded:
        return [f"{where} names {name}, which no rank record lists"]
    if name not in sizes and recorded is not None:
        # the files the records list are checked for their kind and real size by the caller, each
        # with a message of its own ([Note: checksums checked on load] in layout.py)
        sizes[name] = recorded[name]["size"]
    elif name not in sizes:
        link = link_problem(data.parent, f"{data.name}/{name}")
        if link is not None:
            sizes[name] = None
            return [f"{where} names {name}: {link}"]
        kind = file_kind(data / name)
        sizes[name] = (data / name).stat().st_size if kind is None else None
        if kind is not None:
            return [f"{where} names {name}, which {kind}"]
    size = sizes[name]
    if size is None:
        return []  # said at its first entry
    if not isinstance(offset, int) or not isinstance(length, int) or not _whole(offset) or not _whole(length):
        return [f"{where} has offset {offset!r} and length {length!r}, not byte counts (0 or more)"]
    if offset + length > size:
        return [f"{where} reads bytes {offset} to {offset + length} of {name}, which has {size}"]
    if getattr(info, "transform_descriptors", None):
        return [
            f"{where} is stored with transforms {info.transform_descriptors!r}, which fullshard never writes"
        ]
    return []


def _entry_problems(fqn: str, entry: Any, storage: Mapping[Any, Any]) -> list[str]:
    """What is wrong with one tensor (or bytes) entry of the index, against its storage entries."""
    if isinstance(entry, BytesStorageMetadata):
        return [] if MetadataIndex(fqn) in storage else [f"{fqn!r} has no storage entry"]
    if not isinstance(entry, TensorStorageMetadata):
        return [f"{fqn!r} is a {type(entry).__name__}, neither a tensor nor bytes"]
    dtype = getattr(entry.properties, "dtype", None)
    if dtype not in WRITTEN_DTYPES:
        return [f"{fqn!r} has dtype {dtype!r}, which fullshard never writes"]
    shape = tuple(entry.size) if isinstance(entry.size, tuple | list) else None
    if shape is None or not all(_whole(n) for n in shape):
        return [f"{fqn!r} has shape {shape if shape is not None else entry.size!r}, not sizes of 0 or more"]
    assert isinstance(dtype, torch.dtype)
    item = dtype.itemsize
    covered = 0
    for chunk in entry.chunks if isinstance(entry.chunks, list) else ():
        offsets, sizes = tuple(chunk.offsets), tuple(chunk.sizes)
        if (
            len(offsets) != len(shape)
            or len(sizes) != len(shape)
            or not all(_whole(n) for n in offsets + sizes)
            or any(o + n > dim for o, n, dim in zip(offsets, sizes, shape, strict=True))
        ):
            return [f"{fqn!r} has a chunk at {offsets} of {sizes} outside its shape {shape}"]
        info = storage.get(MetadataIndex(fqn, chunk.offsets))
        if info is None:
            return [f"{fqn!r} has no storage entry for its chunk at {offsets}"]
        needed = math.prod(sizes) * item
        length = getattr(info, "length", None)
        if isinstance(length, int) and not needed <= length <= needed + FRAMING:
            return [
                f"{fqn!r} claims a chunk of {sizes} {str(dtype).removeprefix('torch.')} ({needed} bytes) "
                f"stored in {length} bytes"
            ]
        covered += math.prod(sizes)
    if covered != math.prod(shape):
        return [f"{fqn!r} has shape {shape} ({math.prod(shape)} elements), but its chunks hold {covered}"]
    return []


def _whole(value: object) -> bool:
    """A byte count or size: an int of 0 or more (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
