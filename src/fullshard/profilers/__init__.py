"""Profilers under the names a Lightning script imports them by (``lightning.pytorch.profilers``).

``Trainer(profiler="simple" | "advanced" | "pytorch")`` or one of these objects; see
docs/profiling.md.
"""

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
