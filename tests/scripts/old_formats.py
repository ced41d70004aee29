"""Checkpoints rewritten as older fullshard versions wrote them; used by the checkpoint tests."""

from __future__ import annotations

import json
from pathlib import Path

from fullshard.checkpoint.layout import RANK_RECORD_SUFFIX, RECORD_NAME, crc32_of


def as_format_1(ckpt: Path) -> Path:
    """Rewrite the sharded checkpoint ``ckpt`` in place as fullshard wrote it up to commit 5b11ec6
    (format 1): no rank records, and a commit record whose ``files`` lists every file of the data
    directory with its size and CRC-32 (gathered on rank 0 at the commit), without ``rank_records``."""
    record = json.loads((ckpt / RECORD_NAME).read_text())
    data = ckpt / record["data"]
    for file in data.glob(f"__*{RANK_RECORD_SUFFIX}"):
        file.unlink()
    record["files"] = {
        f.name: {"size": f.stat().st_size, "crc32": crc32_of(f)} for f in sorted(data.iterdir())
    }
    record["format_version"] = 1
    del record["rank_records"]
    (ckpt / RECORD_NAME).write_text(json.dumps(record, indent=1, sort_keys=True))
    return ckpt
