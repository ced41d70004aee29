"""Where a resumed ``fit`` starts inside its epoch: the position a checkpoint records (the
samples of the epoch's order consumed) and placing a restored one in this run's training
loader, which may run on another number of processes ([Note: resuming at another world size]
in fullshard.trainer.data). The fit loop calls these with its :class:`Progress` and loader."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fullshard.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from fullshard.trainer.combined_loader import PreparedCombined
    from fullshard.trainer.data import PreparedLoader
    from fullshard.trainer.loops.progress import Progress


def samples_in_epoch(progress: Progress, loader: PreparedLoader | PreparedCombined | None) -> int | None:
    """How many positions of this epoch's order the processes together have consumed (see
    [Note: resuming at another world size]); None where the training loader has no such order."""
    if progress.saved_position is not None:  # restored, not yet placed in this run's loader
        return progress.saved_position.samples
    return (
        None if loader is None else loader.samples_consumed(progress.epoch_start, progress.batches_in_epoch)
    )


def place_restored_position(progress: Progress, loader: PreparedLoader | PreparedCombined | None) -> None:
    """Move on past an epoch that ended at the checkpoint, or place the restored position in
    the training ``loader`` of this run (which may run on another number of processes)."""
    if progress.epoch_end_pending:
        progress.start_next_epoch()
        progress.epoch_end_pending = False
        progress.saved_position = None
        progress.resumed_draws = None
    if progress.data_seed is not None and loader is not None:
        if progress.data_seed != loader.seed:
            rank_zero_warn(
                f"Resuming with the data order of the checkpoint (seed {progress.data_seed}), not of this run's "
                f"seed ({loader.seed}), so that training goes on with the samples it would have seen. To "
                "train on another order, start from the checkpoint's weights (ckpt_weights_only=True).",
                stacklevel=1,
            )
        loader.reseed(progress.data_seed)
        progress.data_seed = None
    position = progress.saved_position
    if position is not None and loader is not None:
        progress.saved_position = None
        progress.epoch_start = loader.resume_start(position, progress.epoch)
        progress.batches_in_epoch = progress.epoch_start[0]
