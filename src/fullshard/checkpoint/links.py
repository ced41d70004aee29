"""Symbolic links in a sharded checkpoint: which a load follows.

[Note: a checkpoint reads only its own directory]
A sharded checkpoint is read only from inside its directory. Every file a load reads there (the
commit record, ``.metadata``, ``meta.pt``, the rank records and the tensor files they list) is
checked before it is opened: a symbolic link on its way (the file itself, or its data directory)
must resolve inside the checkpoint directory (itself resolved, so ``last.ckpt`` may be a link
to a checkpoint). Links inside are fine: a copied checkpoint (``cp -r``, ``rsync -a``) keeps
working, and so do links a tool made between its own files. A link that leads elsewhere
(``__0_0.distcp -> /etc/passwd``, or to another run's shard) is refused with the problem naming
the link and where it resolves, before the file is opened: a checkpoint edited by someone else
could otherwise make a load read any file the loading user can. Storage that deduplicates across
directories with links is the one legitimate use; it opts in with the environment variable
:data:`LINKS_VARIABLE` set to ``1`` (read at each check, by every process of a job, which all
inherit it). A full checkpoint is one file, the path the user gave: no link is checked there.
"""

from __future__ import annotations

import os
from pathlib import Path

from fullshard.errors import MisconfigurationError

# "1": follow symbolic links that lead outside a checkpoint's directory ([Note: a checkpoint reads
# only its own directory])
LINKS_VARIABLE = "FULLSHARD_CHECKPOINT_LINKS_OUTSIDE"
LINK_OUTSIDE = "outside the checkpoint directory"  # how a link problem says it (see damaged_sharded)


def _links_outside_allowed() -> bool:
    value = os.environ.get(LINKS_VARIABLE, "0")
    if value not in ("0", "1"):
        raise MisconfigurationError(
            f"The environment variable {LINKS_VARIABLE}={value!r} is invalid: set it to 1 to let checkpoints "
            "read files that symbolic links inside them lead to outside their directory, or to 0 (or unset "
            "it) to refuse them (the default)."
        )
    return value == "1"


def link_problem(root: Path, relative: str) -> str | None:
    """What is wrong with reading the file ``relative`` (``"data-<id>/__0_0.distcp"``) of the
    checkpoint directory ``root``: a symbolic link on its way that resolves outside ``root``
    (see [Note: a checkpoint reads only its own directory]); None when there is none, or when
    the user allowed it (:data:`LINKS_VARIABLE`). Never raises for the files themselves.

    Raises:
        MisconfigurationError: :data:`LINKS_VARIABLE` has a value other than 0 or 1.
    """
    if _links_outside_allowed():
        return None
    try:
        top = root.resolve()
        current = root
        for part in Path(relative).parts:
            current = current / part
            if current.is_symlink() and not current.resolve().is_relative_to(top):
                return (
                    f"{current.relative_to(root)} is a symbolic link to {os.readlink(current)!r} (resolving to "
                    f"{str(current.resolve())!r}), {LINK_OUTSIDE}, which a load never reads: copy the file "
                    f"into the checkpoint in place of the link, or, if you made the link, set {LINKS_VARIABLE}=1 "
                    "to follow it"
                )
    except (OSError, RuntimeError) as err:  # RuntimeError: a loop of links
        return f"{relative} cannot be resolved ({type(err).__name__}: {err})"
    return None
