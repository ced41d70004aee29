"""Checkpoint I/O: atomic single-file writes, reading with specific errors, state validation."""

from fullshard.checkpoint.io import atomic_torch_save, load_checkpoint_file

__all__ = ["atomic_torch_save", "load_checkpoint_file"]
