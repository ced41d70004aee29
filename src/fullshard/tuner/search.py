"""Running a tuner's trial steps inside ``fit``, and putting everything back afterwards.

[Note: the tuner leaves things as they were]
``lr_find`` and ``scale_batch_size`` train for a few steps inside a ``fit`` call (from
``on_fit_start``). Before that, :class:`Snapshot` records what those steps change: each process's
share of the weights and buffers (no full copy under FSDP: see [Note: averaging the local
shards]), the optimizers' states (their learning rates included), the schedulers, the loop
progress, the logged metrics, and the Trainer settings the search changes. Afterwards it writes
them back, so that training (or the next ``fit``) starts from the same weights, optimizer state
and step as if no search had run. Lightning does the same through a checkpoint file it writes and
reads back; fullshard keeps the copy in memory, next to the parameters it copies, and runs the
checkpoint hooks Lightning's file runs: the save hooks on a checkpoint made in memory before the
search (``CheckpointManager.dump``), the DataModule's, module's and callbacks' load hooks and
states after it (``CheckpointManager.restore_after_search``). What the search published stays in
``callback_metrics``/``logged_metrics``, as after Lightning's.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from fullshard.trainer.callbacks.local_state import clone_to, copy_into, local_tensors
from fullshard.trainer.loggers.base import DummyLogger

if TYPE_CHECKING:
    from fullshard.module import Module
    from fullshard.trainer.callbacks.base import Callback
    from fullshard.trainer.trainer import Trainer


class Snapshot:
    """What a search may change, recorded to be put back by :meth:`restore`."""

    def __init__(self, trainer: Trainer, module: Module) -> None:
        # the Trainer's state through the save hooks, as Lightning's tuners save a checkpoint
        # before they search (and restore it through the load hooks after, on every rank)
        self.checkpoint = trainer.checkpoint_manager.dump(to_save=False)
        self.tensors = clone_to(local_tensors(module), None)
        self.optimizer_states = [copy.deepcopy(o.state_dict()) for o in trainer.optimizers]
        self.scheduler_states = [
            copy.deepcopy(c.scheduler.state_dict()) for c in trainer.lr_scheduler_configs
        ]
        self.settings = (
            trainer.max_steps,
            trainer.limit_train_batches,
            trainer.limit_val_batches,
            trainer.num_sanity_val_steps,
            list(trainer.loggers),
            trainer.should_stop,
            list(trainer.lr_scheduler_configs),
            trainer.optimizers,
        )
        # A search from a hook inside training (a LearningRateFinder subclass at an epoch's start)
        # runs the fit loop within the running one: what that run sets up for itself is put back.
        self.fit_loop = trainer.fit_loop.snapshot()
        self.metrics = trainer.metrics_collector.snapshot()
        self.modes = {name: m.training for name, m in module.named_modules()}
        validate = trainer.validate_loop
        self.val_loaders = (validate.loaders, validate.max_batches)
        collector = trainer.metrics_collector
        self.metrics_stage = (collector.stage, collector.in_step)
        self.batch_state = (trainer.is_last_batch, trainer.batch_idx_start)

    def restore(self, trainer: Trainer, module: Module) -> None:
        copy_into(local_tensors(module), self.tensors, trainer.strategy)
        (
            trainer.max_steps,
            trainer.limit_train_batches,
            trainer.limit_val_batches,
            trainer.num_sanity_val_steps,
            trainer.loggers,
            trainer.should_stop,
            trainer.lr_scheduler_configs,
            trainer.optimizers,
        ) = self.settings
        for optimizer, state in zip(trainer.optimizers, self.optimizer_states, strict=True):
            optimizer.load_state_dict(state)
        for config, state in zip(trainer.lr_scheduler_configs, self.scheduler_states, strict=True):
            config.scheduler.load_state_dict(state)
        collector = trainer.metrics_collector
        # what the search published stays visible (callback_metrics, logged_metrics), as after
        # Lightning's searches; what it was accumulating and its progress bar marks do not
        searched = collector.snapshot()
        collector.restore((searched[0], searched[1], self.metrics[2], self.metrics[3]))
        collector.stage, collector.in_step = self.metrics_stage
        for name, m in module.named_modules():
            m.train(self.modes.get(name, m.training))
        trainer.is_last_batch, trainer.batch_idx_start = self.batch_state
        trainer.fit_loop.restore(self.fit_loop, module)
        trainer.validate_loop.loaders, trainer.validate_loop.max_batches = self.val_loaders
        # the load hooks see the Trainer as it was before the search, as under Lightning
        trainer.checkpoint_manager.restore_after_search(self.checkpoint)


def rebuild_train_loader(trainer: Trainer, module: Module) -> None:
    """Build the training loader afresh after a search (at the batch size found), as Lightning
    does, so that the fit that follows asks for it once, before its ``on_fit_start`` hooks."""
    if trainer.limit_train_batches == 0:  # a fit that trains on nothing asks for no loader
        return
    sources: Any = trainer.data_sources  # the running fit's
    trainer.fit_loop.setup_train_loader(sources.get("train", module))
    trainer.fit_loop.warn_if_few_batches()  # Lightning's set-up of the rebuilt loader says it again


def rebuild_val_loaders(trainer: Trainer, module: Module, snapshot: Snapshot) -> None:
    """Build the validation loaders after a batch size search at the start of ``fit`` (none
    were built then), as Lightning's batch size finder leaves them: ``trainer.val_dataloaders``
    is set afterwards."""
    if not snapshot.val_loaders[0]:
        sources: Any = trainer.data_sources
        trainer.validate_loop.setup_data(module, sources)


def run_trial(trainer: Trainer, module: Module, callbacks: Iterable[Callback]) -> None:
    """Run the fit loop once with only ``callbacks`` (and the module's own hooks), as set up
    by the caller (``max_steps``, limits, schedulers). No sanity validation; nothing logged."""
    from fullshard.trainer.hooks import Hooks

    sources: Any = trainer.data_sources  # the running fit's (the search runs inside fit)
    hooks = Hooks(trainer, list(callbacks), module)
    trainer.num_sanity_val_steps = 0
    # Lightning's: a logger that drops everything in place of the run's (none where it had none)
    trainer.loggers = [DummyLogger()] if trainer.loggers else []
    trainer.should_stop = False
    fit_loop = trainer.fit_loop
    fit_loop.train_loader = None  # built for this trial's settings
    pending, fit_loop.progress.pending = (
        fit_loop.progress.pending,
        None,
    )  # a resume's state waits for the real run
    try:
        fit_loop.run(module, sources, None, hooks)
    finally:
        fit_loop.progress.pending = pending
