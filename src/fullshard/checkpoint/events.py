"""Named points inside a checkpoint save, where tests inject faults.

The save code calls :func:`checkpoint_event` at each point; a test process registers a hook with
:func:`set_event_hook` (for example one that SIGKILLs the process at ``"before_commit"``) to
prove that no such interruption damages the previous checkpoint. Without a hook the calls cost
a function call.

Points, in order: ``"full.mid_data"``, ``"full.before_commit"``, ``"full.after_commit"`` for
single-file checkpoints; ``"sharded.data_written"`` (this rank's tensor files written, no
``.metadata`` yet), ``"sharded.metadata_written"``, ``"sharded.before_commit"`` (commit record
written to a temporary file, not renamed), ``"sharded.after_commit"`` (before old data is
removed) for sharded ones.

A sharded save written in the background (``async_save``, see
:mod:`fullshard.checkpoint.async_save`) signals ``"async.staged"`` in the calling thread (the
copy planned: buffers copied, the writer not started); then, in the writer thread,
``"async.copying"`` (parameters and optimizer state not copied yet: the next optimizer step
waits), ``"async.copied"``, ``"async.writing"`` (nothing read from the copy yet),
``"sharded.data_written"``, ``"sharded.metadata_written"``, ``"async.written"`` (this rank's
files written and fsynced, or its write failed; the ranks have not exchanged results yet),
``"sharded.before_commit"`` and ``"sharded.after_commit"`` (rank 0 only, which commits), and
``"async.finished"`` once every rank knows the outcome.
"""

from __future__ import annotations

from collections.abc import Callable

_hook: Callable[[str], None] | None = None


def set_event_hook(hook: Callable[[str], None] | None) -> None:
    """Call ``hook(point)`` at every save point of this process (None removes it)."""
    global _hook
    _hook = hook


def checkpoint_event(point: str) -> None:
    """Signal that a save reached ``point``."""
    if _hook is not None:
        _hook(point)
