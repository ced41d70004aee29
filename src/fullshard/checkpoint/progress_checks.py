"""The loop state a checkpoint carries (its ``"loops"`` entry), checked before a resume believes it.

[Note: loop counters checked on resume]
A resume puts the checkpoint's counters back as they are: a ``global_step`` of -7 would train 12
steps to reach ``max_steps=5``, one of 10**18 would end the run at once, a ``batches_in_epoch``
of 10**12 would skip the epoch, and a string where a dict belongs fails deep inside the loop with
a bare ``TypeError``. So before anything is loaded (on rank 0, with the engine's other checks,
whose error every rank raises), each entry must have its type and lie in its range:

- the step, batch and epoch counters are ints (a bool is no count) from 0 to :data:`MAX_COUNT`
  (10**10: at a thousand steps a second, four months of training; no run comes near it);
- ``samples_in_epoch`` (positions of the epoch's order consumed) from 0 to :data:`MAX_SAMPLES`,
  or None; ``data_seed`` what ``torch.Generator.manual_seed`` takes, or None; ``epoch_finished``
  a bool; the generator states bytes or None (their size is checked where they are used);
  ``loader_positions`` a list of ``{"batches": count, "samples": count or None}``;
- ``batches_that_stepped`` (batches that ended an accumulation window) cannot exceed
  ``total_batch_idx`` (batches run in all epochs), which counts each of those batches too (a
  checkpoint without it, Lightning's or an older one, resumes with at most ``total_batch_idx``:
  ``Progress.load_state_dict``).
  ``batches_in_epoch`` is not compared with ``total_batch_idx``: a resume at another world size
  moves the batch index within the epoch and not the total.

A checkpoint that fails raises :class:`~fullshard.errors.CorruptCheckpointError` naming the entry,
its value and the accepted range. Lightning's ``loops`` entry is checked as it is converted
(:func:`fullshard.checkpoint.lightning.loop_state`), then as fullshard's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fullshard.errors import CorruptCheckpointError

MAX_COUNT = 10**10
MAX_SAMPLES = 10**15
_SEEDS = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed accepts
_REQUIRED = ("epoch", "global_step", "batches_in_epoch")
_COUNTS = (*_REQUIRED, "batches_that_stepped", "total_batch_idx")
_FIX = (
    "Resume from a checkpoint written by Trainer.save_checkpoint() or ModelCheckpoint, or start afresh from "
    "its weights with fit(..., ckpt_weights_only=True). Nothing was loaded."
)


def loop_state_error(path: str | Path, entry: str, value: Any, accepted: str) -> CorruptCheckpointError:
    """The error of a loop state entry (``"loops['global_step']"``) outside what is accepted."""
    shown = repr(value) if len(repr(value)) <= 60 else f"{repr(value)[:57]}..."
    return CorruptCheckpointError(
        f"The checkpoint {str(path)!r} is damaged or was edited: its {entry} is {shown} "
        f"({type(value).__name__}), but {accepted}. {_FIX}"
    )


def check_count(path: str | Path, entry: str, value: Any, limit: int = MAX_COUNT) -> int:
    """``value`` if it is an int from 0 to ``limit`` (a bool is not), else the error naming ``entry``."""
    if type(value) is not int or not 0 <= value <= limit:
        raise loop_state_error(path, entry, value, f"it must be an int from 0 to {limit:,}")
    return value


def check_loop_state(loops: Any, path: str | Path) -> None:
    """Raise :class:`~fullshard.errors.CorruptCheckpointError` unless ``loops`` (a checkpoint's
    ``"loops"`` entry) is a loop state fullshard can resume from: see [Note: loop counters
    checked on resume]."""
    if not isinstance(loops, Mapping):
        raise loop_state_error(
            path,
            "'loops' entry",
            loops,
            f"it must be a dict of the loop's counters ({', '.join(_REQUIRED)}, ...)",
        )
    missing = [key for key in _REQUIRED if key not in loops]
    if missing:
        raise CorruptCheckpointError(
            f"The checkpoint {str(path)!r} is damaged or was edited: its 'loops' entry lacks "
            f"{', '.join(map(repr, missing))}. {_FIX}"
        )
    for key in _COUNTS:
        if key in loops:
            check_count(path, f"loops[{key!r}]", loops[key])
    _check_optional(loops, path)
    stepped, total = loops.get("batches_that_stepped"), loops.get("total_batch_idx")
    if stepped is not None and total is not None and stepped > total:
        raise loop_state_error(
            path,
            "loops['batches_that_stepped']",
            stepped,
            f"it counts batches that ended an accumulation window, so it cannot exceed loops['total_batch_idx'] "
            f"({total}), the batches run in all epochs",
        )


def _check_optional(loops: Mapping[str, Any], path: str | Path) -> None:
    samples = loops.get("samples_in_epoch")
    if samples is not None:
        check_count(path, "loops['samples_in_epoch']", samples, MAX_SAMPLES)
    seed = loops.get("data_seed")
    if seed is not None and (type(seed) is not int or not _SEEDS[0] <= seed <= _SEEDS[1]):
        raise loop_state_error(
            path, "loops['data_seed']", seed, f"it must be None or an int from {_SEEDS[0]} to {_SEEDS[1]}"
        )
    if "epoch_finished" in loops and type(loops["epoch_finished"]) is not bool:
        raise loop_state_error(
            path, "loops['epoch_finished']", loops["epoch_finished"], "it must be True or False"
        )
    for key in ("epoch_rng_state", "epoch_order_state"):
        if loops.get(key) is not None and not isinstance(loops[key], bytes):
            raise loop_state_error(
                path, f"loops[{key!r}]", loops[key], "it must be None or a generator state saved as bytes"
            )
    positions = loops.get("loader_positions")
    if positions is None:
        return
    if not isinstance(positions, list):
        raise loop_state_error(
            path, "loops['loader_positions']", positions, "it must be None or a list with one dict per loader"
        )
    for i, position in enumerate(positions):
        entry = f"loops['loader_positions'][{i}]"
        if not isinstance(position, Mapping) or "batches" not in position or "samples" not in position:
            raise loop_state_error(path, entry, position, "it must be a dict of 'batches' and 'samples'")
        check_count(path, f"{entry}['batches']", position["batches"])
        if position["samples"] is not None:
            check_count(path, f"{entry}['samples']", position["samples"], MAX_SAMPLES)


def check_world_size(meta: Mapping[str, Any], path: str | Path) -> None:
    """The process counts a checkpoint records (the loop places its position with them), if any:
    ints from 1 to :data:`MAX_COUNT`."""
    for key in ("world_size", "data_parallel_size"):
        value = meta.get(key)
        if value is not None and (type(value) is not int or not 1 <= value <= MAX_COUNT):
            raise loop_state_error(path, repr(key), value, f"it must be an int from 1 to {MAX_COUNT:,}")


def with_loop_checks(
    path: str | Path, check: Callable[[dict[str, Any]], None] | None
) -> Callable[[dict[str, Any]], None]:
    """``check`` (the engine's host check of a checkpoint's metadata), after the loop state's and
    the process counts' checks: what a resume runs before anything is loaded."""

    def checked(meta: dict[str, Any]) -> None:
        check_world_size(meta, path)
        check_loop_state(meta["loops"], path)
        if check is not None:
            check(meta)

    return checked
