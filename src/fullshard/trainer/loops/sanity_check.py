"""The sanity check of ``fit``: a few validation batches before training, to catch a broken
``validation_step`` before a long run does (``Trainer(num_sanity_val_steps=)``). Their metrics
are forgotten, and while it runs ``trainer.sanity_checking`` is True, as in Lightning."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fullshard.module import Module
from fullshard.trainer.preflight import overrides

if TYPE_CHECKING:
    from fullshard.trainer.hooks import Hooks
    from fullshard.trainer.loops.evaluation_loop import EvaluationLoop
    from fullshard.trainer.metrics import MetricsCollector
    from fullshard.trainer.preflight import DataSources
    from fullshard.trainer.trainer import Trainer


def run_sanity_check(
    trainer: Trainer,
    validate_loop: EvaluationLoop,
    metrics: MetricsCollector,
    module: Module,
    sources: DataSources,
    hooks: Hooks,
) -> bool:
    """Run ``num_sanity_val_steps`` validation batches before training, then forget every metric
    shown so far (theirs, and an earlier call's or a tuner's search's, as Lightning resets them). The validation loader is asked for here, after ``on_sanity_check_start``, as in
    Lightning. Returns whether the sanity run took place."""
    wanted = (
        trainer.num_sanity_val_steps != 0
        and trainer.limit_val_batches != 0
        and overrides(module, Module, "validation_step")
        and sources.has("val", module)
    )
    if not wanted:
        return False
    trainer.sanity_checking = True
    try:
        hooks.call("on_sanity_check_start")
        validate_loop.setup_data(module, sources)
        batches = validate_loop.sanity_batches()
        if batches:
            validate_loop.run(hooks, batches)
        hooks.call("on_sanity_check_end")
    finally:
        trainer.sanity_checking = False
        metrics.restore(({}, {}, set(), {}))
    return True
