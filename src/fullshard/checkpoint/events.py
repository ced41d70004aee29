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
