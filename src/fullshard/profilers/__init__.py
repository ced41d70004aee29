"""Profilers under the names a Lightning script imports them by (``lightning.pytorch.profilers``).

``Trainer(profiler="simple" | "advanced" | "pytorch")`` or one of these objects; see
docs/profiling.md.
"""

from typing import TYPE_CHECKING

from fullshard.lightning_aliases import lightning_names
from fullshard.profilers.advanced import AdvancedProfiler
from fullshard.profilers.attach import profiled_call, resolve_profiler
from fullshard.profilers.base import PassThroughProfiler, Profiler
from fullshard.profilers.pytorch import PyTorchProfiler
from fullshard.profilers.simple import SimpleProfiler

__all__ = [
    "AdvancedProfiler",
    "PassThroughProfiler",
    "Profiler",
    "PyTorchProfiler",
    "SimpleProfiler",
    "profiled_call",
    "resolve_profiler",
]

if not TYPE_CHECKING:  # Lightning's names that live elsewhere: [Note: Lightning's module paths]
    __getattr__ = lightning_names(__name__)
