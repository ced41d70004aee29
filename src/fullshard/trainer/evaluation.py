"""The evaluation loops: validation (also the sanity run before training), test and predict.

Each run calls, as Lightning does: ``on_<stage>_start``, ``on_<stage>_epoch_start``, per batch
``on_<stage>_batch_start``, the step, ``on_<stage>_batch_end``; then the epoch-level metrics
are reduced, ``on_<stage>_epoch_end`` runs (what it logs is an epoch value), the epoch's
metrics go to the loggers in one row, and ``on_<stage>_end`` runs (where ``ModelCheckpoint``
and ``EarlyStopping`` act on validation metrics).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from fullshard.launch import stuck_ranks

if TYPE_CHECKING:
    from fullshard.module import Module
    from fullshard.trainer.data import PreparedLoader
    from fullshard.trainer.preflight import DataSources
    from fullshard.trainer.trainer import Trainer

_HOOK_STAGE = {"validate": "validation", "test": "test", "predict": "predict"}


def run_sanity_check(trainer: Trainer, model: Module, sources: DataSources) -> bool:
    """Run ``num_sanity_val_steps`` validation batches before training and forget their metrics.

    The validation loader is asked for here, after ``on_sanity_check_start``, as in Lightning.
    Returns whether the sanity run took place.
    """
    if not trainer._sanity_wanted(model, sources):
        return False
    metrics = trainer._metrics
    snapshot = metrics.snapshot()
    trainer.sanity_checking = True
    try:
        trainer._call("on_sanity_check_start")
        trainer._setup_val_data(model, sources)
        batches = trainer._sanity_batches()
        if batches:
            _run(trainer, "validate", trainer._val_loader, batches)
        trainer._call("on_sanity_check_end")
    finally:
        trainer.sanity_checking = False
        metrics.restore(snapshot)
    return True


def run_validation(trainer: Trainer) -> dict[str, float]:
    """One pass over the validation data; returns the epoch-level validation metrics."""
    return _run(trainer, "validate", trainer._val_loader, trainer._val_batches)


def run_test(trainer: Trainer) -> dict[str, float]:
    """One pass over the test data; returns the epoch-level test metrics."""
    return _run(trainer, "test", trainer._test_loader, trainer._test_batches)


def run_predict(trainer: Trainer, keep: bool) -> list[Any]:
    """One pass over the prediction data; returns this process's predictions (when ``keep``)."""
    predictions: list[Any] = []
    _run(trainer, "predict", trainer._predict_loader, trainer._predict_batches, predictions if keep else None)
    return predictions


@torch.no_grad()
def _run(
    trainer: Trainer,
    stage: str,
    loader: PreparedLoader | None,
    num_batches: int | float,
    predictions: list[Any] | None = None,
) -> dict[str, float]:
    if loader is None or num_batches == 0:
        return {}
    name = _HOOK_STAGE[stage]
    strategy = trainer.strategy
    module = trainer.lightning_module
    metrics = trainer._metrics
    hooks = trainer._hooks
    batch_start = hooks[f"on_{name}_batch_start"]
    batch_end = hooks[f"on_{name}_batch_end"]
    method = f"{name}_step"
    was_training = module.training
    metrics.stage = stage
    metrics.in_step = False
    metrics.epoch_results()  # start a fresh record of this run's epoch values
    module.eval()
    trainer._call(f"on_{name}_start")
    trainer._call(f"on_{name}_epoch_start")
    metrics.in_step = True
    iterator = loader.iterate(0)
    batch_idx = 0
    while batch_idx < num_batches:
        try:
            batch = next(iterator)
        except StopIteration:
            break
        stuck_ranks.kick(stage, batch_idx)  # [Note: stuck ranks] in fullshard.launch.stuck_ranks
        batch = strategy.batch_to_device(batch)
        metrics.set_batch(batch)
        for hook in batch_start:
            hook(batch, batch_idx, 0)
        output = strategy.evaluation_step(method, batch, batch_idx)
        if predictions is not None:
            predictions.append(output)
        for hook in batch_end:
            hook(output, batch, batch_idx, 0)
        batch_idx += 1
        if metrics.has_step_log():
            values = metrics.pop_step_log()
            if not trainer.sanity_checking:
                trainer._log_metrics(values, trainer._batches_that_stepped)
    metrics.in_step = False
    metrics.reduce_epoch(stage)
    trainer._call(f"on_{name}_epoch_end")
    values = metrics.pop_epoch_log()
    if values and not trainer.sanity_checking:
        trainer._log_metrics(values, trainer._batches_that_stepped)
    results = metrics.epoch_results()
    trainer._call(f"on_{name}_end")
    metrics.in_step = True
    module.train(was_training)
    return results
