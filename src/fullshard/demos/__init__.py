"""Self-contained demo model and data: a small Transformer and a byte dataset read from Python's stdlib."""

from fullshard.demos.data import StdlibText
from fullshard.demos.transformer import Transformer

__all__ = ["StdlibText", "Transformer"]
