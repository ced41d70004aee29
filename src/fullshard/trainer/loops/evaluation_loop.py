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
from fullshard.module import Module
from fullshard.trainer import data_setup
from fullshard.trainer.loggers import send_to_loggers
from fullshard.trainer.preflight import overrides

if TYPE_CHECKING:
    from fullshard.trainer.data import PreparedLoader
    from fullshard.trainer.hooks import Hooks
    from fullshard.trainer.metrics import MetricsCollector
    from fullshard.trainer.preflight import DataSources
    from fullshard.trainer.trainer import Trainer

_HOOK_STAGE = {"validate": "validation", "test": "test", "predict": "predict"}
_DATA_KIND = {"validate": "val", "test": "test", "predict": "predict"}


class EvaluationLoop:
    """One pass over the data of ``stage`` (``"validate"``, ``"test"`` or ``"predict"``); owns
    that stage's loader and batch count, which stay readable after the call."""

    def __init__(self, trainer: Trainer, metrics: MetricsCollector, stage: str) -> None:
        self.trainer = trainer
        self.metrics = metrics
        self.stage = stage
        self.loader: PreparedLoader | None = None
        self.num_batches: int | float = 0

    @property
    def batches_per_loader(self) -> list[int | float]:
        """Batches per run, one entry per dataloader (Lightning's form)."""
        return [] if self.loader is None else [self.num_batches]

    def setup_data(self, module: Module, sources: DataSources) -> None:
        """Build this stage's loader (validation only when the module has a ``validation_step``)."""
        self.loader, self.num_batches = None, 0
        kind = _DATA_KIND[self.stage]
        if self.stage == "validate" and not overrides(module, Module, "validation_step"):
            return
        loader = sources.get(kind, module)
        if loader is not None:
            self.loader, self.num_batches = data_setup.prepare(self.trainer, loader, kind)

    def sanity_batches(self) -> int | float:
        """How many batches the sanity run before training takes."""
        wanted = self.trainer.num_sanity_val_steps
        if self.loader is None or wanted == 0:
            return 0
        return self.num_batches if wanted == -1 else min(wanted, self.num_batches)

    @torch.no_grad()
    def run(
        self, hooks: Hooks, num_batches: int | float | None = None, predictions: list[Any] | None = None
    ) -> dict[str, float]:
        """Run the stage over ``num_batches`` (default: all of this run's); returns the epoch-level
        metrics. ``predictions``: a list that collects each ``predict_step`` result."""
        num_batches = self.num_batches if num_batches is None else num_batches
        loader = self.loader
        if loader is None or num_batches == 0:
            return {}
        trainer, metrics, stage = self.trainer, self.metrics, self.stage
        name = _HOOK_STAGE[stage]
        strategy = trainer.strategy
        module = trainer.lightning_module
        batch_start = hooks[f"on_{name}_batch_start"]
        batch_end = hooks[f"on_{name}_batch_end"]
        method = f"{name}_step"
        was_training = module.training
        metrics.stage = stage
        metrics.in_step = False
        metrics.epoch_results()  # start a fresh record of this run's epoch values
        module.eval()
        hooks.call(f"on_{name}_start")
        hooks.call(f"on_{name}_epoch_start")
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
                    send_to_loggers(trainer, values, trainer.logger_step)
        metrics.in_step = False
        metrics.reduce_epoch(stage)
        hooks.call(f"on_{name}_epoch_end")
        values = metrics.pop_epoch_log()
        if values and not trainer.sanity_checking:
            send_to_loggers(trainer, values, trainer.logger_step)
        results = metrics.epoch_results()
        hooks.call(f"on_{name}_end")
        metrics.in_step = True
        module.train(was_training)
        return results
