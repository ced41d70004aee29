"""Choosing the Trainer's profiler, and profiling one ``fit``/``validate``/``test``/``predict`` call.

The hooks and the strategy's steps are timed where the Trainer dispatches them
(:class:`fullshard.trainer.hooks.Hooks`, [Note: profiling at the dispatch]), the training epoch by
the fit loop and ``save_checkpoint`` by the Trainer, each under Lightning's action name: nothing
is replaced on the objects. Here the profiler is set up before the call and reports after it.
Under the :class:`PassThroughProfiler` (``Trainer(profiler=None)``) none of this happens.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING

from fullshard.errors import MisconfigurationError
from fullshard.profilers.advanced import AdvancedProfiler
from fullshard.profilers.base import PassThroughProfiler, Profiler
from fullshard.profilers.pytorch import PyTorchProfiler
from fullshard.profilers.simple import SimpleProfiler

if TYPE_CHECKING:
    from fullshard.trainer.trainer import Trainer

# ``Trainer(profiler="simple")`` etc.; fullshard's shorthands also write the report to a file
# (``<log_dir>/<stage>-profiler[-<rank>].txt``), where Lightning's only print it
_BY_NAME: dict[str, Callable[[], Profiler]] = {
    "simple": lambda: SimpleProfiler(filename="profiler"),
    "advanced": lambda: AdvancedProfiler(filename="profiler"),
    "pytorch": lambda: PyTorchProfiler(filename="profiler"),
}


def resolve_profiler(profiler: Profiler | str | None) -> Profiler:
    """``Trainer(profiler=...)``: None (no profiling), a name or a :class:`Profiler`."""
    if profiler is None:
        return PassThroughProfiler()
    if isinstance(profiler, Profiler):
        return profiler
    if isinstance(profiler, str) and profiler.lower() in _BY_NAME:
        return _BY_NAME[profiler.lower()]()
    raise MisconfigurationError(
        f"profiler={profiler!r} is invalid: use None, one of {sorted(_BY_NAME)}, or a profiler object from "
        "fullshard.profilers (SimpleProfiler, AdvancedProfiler, PyTorchProfiler, or your Profiler subclass)."
    )


@contextlib.contextmanager
def profiled_call(trainer: Trainer, stage: str) -> Generator[None, None, None]:
    """Profile the call ``stage`` of ``trainer`` with ``trainer.profiler`` and report it at the end
    (each rank writes its file; global rank 0 prints)."""
    profiler = trainer.profiler
    if isinstance(profiler, PassThroughProfiler):
        yield
        return
    profiler.setup(
        stage, local_rank=trainer.local_rank if trainer.world_size > 1 else None, log_dir=trainer.log_dir
    )
    try:
        yield
    finally:
        profiler.describe(print_report=trainer.is_global_zero)
