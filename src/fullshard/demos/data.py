"""A byte-level language-modelling dataset cut from the Python standard library's own sources.

Every Python installation ships its standard library as ``.py`` files, so this dataset needs no
download and no network: it reads those files (sorted, so the order is the same on every run
and every rank), concatenates their bytes and cuts the stream into non-overlapping blocks.
"""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from torch.utils.data import Dataset

__all__ = ["StdlibText"]

# Folders under the stdlib directory that hold third-party or generated files. Their content
# differs between installations, so reading them would make the dataset machine-dependent.
_SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})


def _stdlib_sources(root: Path) -> Iterator[Path]:
    """Yield the ``.py`` files under ``root`` in a fixed order: depth first, names sorted.

    Walking lazily (instead of listing everything and sorting) lets the reader stop as soon as
    it has enough bytes, which keeps construction well under a second.
    """
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIPPED_DIRS)
        for filename in sorted(filenames):
            if filename.endswith(".py"):
                yield Path(dirpath, filename)


class StdlibText(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Next-byte prediction samples from the standard library's ``.py`` sources.

    Item ``i`` is ``(input, target)`` with ``input = data[i * block_size : (i + 1) * block_size]``
    and ``target = data[i * block_size + 1 : (i + 1) * block_size + 1]``, both ``int64`` tensors
    of shape ``(block_size,)`` holding byte values in ``[0, 256)``. Blocks do not overlap.

    Args:
        block_size: Length of each sample, in bytes.
        max_bytes: Stop reading once this many bytes are collected. The default (4 MiB) keeps
            construction fast; ``None`` reads every file.
        files: Read these files, in this order, instead of the standard library's sources.

    Attributes:
        block_size: As given.
        files_read: How many files the bytes came from.
    """

    #: Number of distinct tokens: one per byte value.
    vocab_size: int = 256

    def __init__(
        self,
        block_size: int = 64,
        max_bytes: int | None = 4 * 2**20,
        files: Sequence[str | os.PathLike[str]] | None = None,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"`block_size` must be a positive integer, got {block_size!r}.")
        if max_bytes is not None and max_bytes < block_size + 1:
            raise ValueError(
                f"`max_bytes={max_bytes}` is too small for one sample of `block_size={block_size}`: "
                f"a sample needs `block_size + 1` bytes. Pass `max_bytes >= {block_size + 1}`, "
                "or `max_bytes=None` to read every file."
            )
        self.block_size = block_size

        if files is None:
            root = Path(sysconfig.get_paths()["stdlib"])
            paths: Iterator[Path] = _stdlib_sources(root)
            origin = f"the standard library at {str(root)!r}"
        else:
            paths = (Path(f) for f in files)
            origin = f"`files={list(files)!r}`"

        data = bytearray()
        num_files = 0
        for path in paths:
            data += path.read_bytes()
            num_files += 1
            if max_bytes is not None and len(data) >= max_bytes:
                del data[max_bytes:]
                break
        if num_files == 0:
            raise ValueError(
                f"No text files found in {origin}. Pass `files=[...]` with paths of text files to read."
            )
        if len(data) < block_size + 1:
            raise ValueError(
                f"Read only {len(data)} bytes from {origin}, fewer than the {block_size + 1} that one "
                f"sample of `block_size={block_size}` needs. Lower `block_size` or add more files."
            )
        self.files_read = num_files
        # clone: the tensor must own its memory rather than view the local bytearray.
        self._data = torch.frombuffer(data, dtype=torch.uint8).clone()
        self._length = (len(data) - 1) // block_size

    @property
    def num_bytes(self) -> int:
        """Number of bytes read from the files."""
        return int(self._data.numel())

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError(f"index {index} is out of range for a dataset of {self._length} blocks")
        start = index * self.block_size
        chunk = self._data[start : start + self.block_size + 1].to(torch.int64)
        return chunk[:-1], chunk[1:]
