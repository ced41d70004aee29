"""Which checkpoints a directory holds: complete ones (a file, which is written atomically, or a
committed sharded directory), when each was committed, and the newest. ``ModelCheckpoint`` and
``ckpt_path="last"`` both ask here."""

from __future__ import annotations

import os
from pathlib import Path

from fullshard.checkpoint.layout import RECORD_NAME


def is_complete(path: Path) -> bool:
    """A checkpoint file (written atomically) or a committed sharded checkpoint directory."""
    return path.is_file() or (path / RECORD_NAME).is_file()


def commit_time(path: Path) -> int:
    """When the checkpoint at ``path`` (a file, a sharded directory, or a link to one) was committed."""
    return (path if path.is_file() else path / RECORD_NAME).stat().st_mtime_ns


def newest_complete(dirpath: str, extension: str, last_prefix: str) -> str | None:
    """The newest complete checkpoint under ``dirpath``; a "last" one (name starting with
    ``last_prefix``) committed at the same moment as the checkpoint it copies or links wins."""
    if not os.path.isdir(dirpath):
        return None
    found = [p for p in Path(dirpath).rglob("*" + extension) if is_complete(p)]
    if not found:
        return None
    newest = max(commit_time(p) for p in found)
    at_newest = [p for p in found if commit_time(p) == newest]
    lasts = [p for p in at_newest if p.name.startswith(last_prefix)]
    return str((lasts or at_newest)[0])
