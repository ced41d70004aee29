"""Checkpoint I/O: atomic single-file writes, reading with specific errors, state validation,
and the exported weights (``fullshard checkpoint export``) read back with their ties."""

from fullshard.checkpoint.io import atomic_torch_save, load_checkpoint_file
from fullshard.checkpoint.tools import export_safetensors, load_exported

__all__ = ["atomic_torch_save", "export_safetensors", "load_checkpoint_file", "load_exported"]
