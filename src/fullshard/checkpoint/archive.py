"""Full checkpoint files (one ``torch.save`` zip archive): the CRC-32 each entry carries, checked
on load (see [Note: checksums checked on load] in layout.py).
"""

from __future__ import annotations

import struct
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fullshard.checkpoint.layout import CHUNK, Format, crc32_of_range
from fullshard.errors import CorruptCheckpointError

_LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # a zip entry's local header: 30 bytes
_ZIP_MAGIC = b"PK\x03\x04"
PICKLE_ENTRY = "data.pkl"  # torch.save's pickle: every other entry is read through it


@dataclass(frozen=True)
class ArchiveEntry:
    """One entry of a ``torch.save`` archive: where its bytes are and the CRC-32 recorded for them."""

    name: str
    offset: int
    size: int
    crc32: int


def _damaged_file(path: Path, detail: str, hint: str = "") -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f"The checkpoint file {str(path)!r} is damaged{detail}. Nothing was loaded. Resume from an earlier "
        "checkpoint instead." + (f" {hint}" if hint else "")
    )


def archive_entries(path: Path) -> list[ArchiveEntry] | None:
    """The entries of the ``torch.save`` archive ``path`` that carry a CRC-32, in file order; None
    when there is nothing to check against (see [Note: checksums checked on load]).

    Raises:
        CorruptCheckpointError: the archive's directory or an entry's header is damaged.
    """
    with open(path, "rb") as f:
        if f.read(4) != _ZIP_MAGIC:
            return None  # torch's legacy (pre-1.6) format: no checksums
    try:
        with zipfile.ZipFile(path) as archive:
            infos = archive.infolist()
        entries = []
        with open(path, "rb") as f:
            for info in infos:
                if info.compress_type != zipfile.ZIP_STORED:
                    raise zipfile.BadZipFile(
                        f"entry {info.filename!r} is compressed, which torch.save never does"
                    )
                if info.CRC == 0:
                    continue  # empty, or written with compute_crc32=False
                f.seek(info.header_offset)
                header = f.read(_LOCAL_HEADER.size)
                if len(header) != _LOCAL_HEADER.size or header[:4] != _ZIP_MAGIC:
                    raise zipfile.BadZipFile(f"the header of entry {info.filename!r} is damaged")
                *_, name_length, extra_length = _LOCAL_HEADER.unpack(header)
                offset = info.header_offset + _LOCAL_HEADER.size + name_length + extra_length
                entries.append(ArchiveEntry(info.filename, offset, info.file_size, info.CRC))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, struct.error, ValueError) as err:
        raise _damaged_file(path, f" or not a checkpoint ({err})") from err
    return sorted(entries, key=lambda e: e.offset) or None


def entry_problems(path: Path, entries: Sequence[ArchiveEntry]) -> list[str]:
    """The entries of ``path`` whose bytes fail their CRC-32 check. Never raises."""
    problems = []
    buffer = bytearray(CHUNK)
    try:
        with open(path, "rb", buffering=0) as f:
            for entry in entries:
                f.seek(entry.offset)
                if crc32_of_range(f, buffer, entry.size) != entry.crc32:
                    problems.append(f"entry {entry.name!r} fails its CRC-32 check")
    except OSError as err:
        problems.append(f"it cannot be read ({type(err).__name__}: {err})")
    return problems


def full_file_error(path: Path, problems: Sequence[str], hint: str = "") -> CorruptCheckpointError:
    """The error for a checkpoint file whose entries have ``problems``."""
    return _damaged_file(path, f": {'; '.join(problems)}", hint)


def verify_full_file(path: Path, hint: str = "") -> bool:
    """Check every entry of a checkpoint file against the CRC-32 ``torch.save`` recorded for it.

    ``torch.load`` does not check these, so a flipped byte inside tensor data loads silently.
    Returns False when the file carries no checksums to check (see [Note: checksums checked on load]).

    Raises:
        CorruptCheckpointError: an entry fails its check, or the file is not a readable archive.
    """
    entries = archive_entries(path)
    if entries is None:
        return False
    problems = entry_problems(path, entries)
    if problems:
        raise full_file_error(path, problems, hint)
    return True


def verify(path: str | Path, trust_checkpoint: bool = False) -> Format:
    """Check a checkpoint of either format completely, reading every byte, as a load reads it;
    returns its format. :func:`fullshard.checkpoint.tools.verify` (see [Note: verify checks what a
    load checks] there), kept here where it has always been importable from."""
    from fullshard.checkpoint.tools import verify as verify_as_loaded  # tools imports this module

    return verify_as_loaded(path, trust_checkpoint)
