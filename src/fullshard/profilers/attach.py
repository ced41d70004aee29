"""Choosing the Trainer's profiler, and profiling one ``fit``/``validate``/``test``/``predict`` call.

The hooks are wrapped where they are dispatched (:class:`fullshard.trainer.hooks.Hooks`); the
strategy's steps and the training epoch are wrapped here, on the objects themselves, for the
length of the call (instance attributes that shadow the methods, removed when it ends). Under
the :class:`PassThroughProfiler` (``Trainer(profiler=None)``) none of this happens.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

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
_STRATEGY_STEPS = ("batch_to_device", "training_step", "backward", "optimizer_step")


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
    patched: list[tuple[Any, str]] = []

    def patch(owner: Any, name: str, replacement: Callable[..., Any]) -> None:
        setattr(owner, name, replacement)
        patched.append((owner, name))

    strategy = trainer.strategy
    kind = type(strategy).__name__
    for name in _STRATEGY_STEPS:
        patch(strategy, name, profiler.wrap(f"[Strategy]{kind}.{name}", getattr(strategy, name)))
    evaluation_step = strategy.evaluation_step

    def profiled_evaluation_step(method: str, batch: Any, batch_idx: int, *extra: Any) -> Any:
        with profiler.profile(f"[Strategy]{kind}.{method}"):  # extra: dataloader_idx with several loaders
            return evaluation_step(method, batch, batch_idx, *extra)

    patch(strategy, "evaluation_step", profiled_evaluation_step)
    patch(trainer.fit_loop, "run_epoch", profiler.wrap("run_training_epoch", trainer.fit_loop.run_epoch))
    patch(trainer, "save_checkpoint", profiler.wrap("save_checkpoint", trainer.save_checkpoint))
    try:
        yield
    finally:
        for owner, name in reversed(patched):
            delattr(owner, name)
        profiler.describe(print_report=trainer.is_global_zero)
