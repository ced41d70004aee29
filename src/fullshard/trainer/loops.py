"""The training and validation loops the Trainer runs.

The hot path (one micro-batch) does: move the batch, run the step through the strategy,
backward, and on the last micro-batch of an accumulation window clip and step. Callback
dispatch goes only to callbacks that override a hook (see ``Trainer._hooks``), so idle
callbacks cost nothing per step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from fullshard.errors import MisconfigurationError

if TYPE_CHECKING:
    from fullshard.trainer.trainer import Trainer


def extract_loss(output: Any) -> torch.Tensor | None:
    """The loss of a ``training_step`` result: a tensor, ``{"loss": tensor}``, or None (skip)."""
    if output is None or isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping) and "loss" in output:
        loss = output["loss"]
        if isinstance(loss, torch.Tensor):
            return loss
    raise MisconfigurationError(
        f"training_step returned {type(output).__name__}; return the loss tensor, a dict with a 'loss' "
        "tensor, or None to skip the batch."
    )


def run_fit(trainer: Trainer) -> None:
    """Train until ``max_steps`` or ``max_epochs`` is reached."""
    module = trainer.model
    trainer._call("on_train_start")
    while not trainer._done():
        run_train_epoch(trainer)
        if trainer.should_stop:
            break
    trainer._call("on_train_end")
    module.on_fit_end()
    trainer._call("on_fit_end")


def run_train_epoch(trainer: Trainer) -> None:
    """One epoch (or its remainder, when resuming mid-epoch)."""
    strategy = trainer.strategy
    module = trainer.model
    metrics = trainer._metrics
    loader = trainer._train_loader
    assert loader is not None
    num_batches = trainer.num_training_batches
    start = trainer._batches_in_epoch
    trainer.batch_idx_start = start
    accumulate = trainer.accumulate_grad_batches
    val_every = trainer._val_check_batches
    hooks = trainer._hooks

    metrics.stage = "train"
    module.train()
    module.on_train_epoch_start()
    trainer._call("on_train_epoch_start")
    iterator = loader.iterate(trainer.current_epoch, skip_batches=start)
    batch_idx = start
    while batch_idx < num_batches:
        try:
            batch = next(iterator)
        except StopIteration:
            strategy.check_rank_agreement(
                "end_of_data", str(batch_idx), f"the training data ended after {batch_idx} batches"
            )
            break
        batch = strategy.batch_to_device(batch)
        for cb in hooks["on_train_batch_start"]:
            cb.on_train_batch_start(trainer, module, batch, batch_idx)
        boundary = (batch_idx + 1) % accumulate == 0 or batch_idx + 1 == num_batches
        with strategy.no_backward_sync(enabled=not boundary):
            output = strategy.training_step(batch, batch_idx)
            loss = extract_loss(output)
            if loss is None:
                strategy.check_rank_agreement(
                    "skip",
                    f"{trainer.current_epoch}:{batch_idx}",
                    f"training_step returned None at epoch {trainer.current_epoch}, batch {batch_idx}",
                )
            else:
                if accumulate > 1:
                    loss = loss / accumulate
                for cb in hooks["on_before_backward"]:
                    cb.on_before_backward(trainer, module, loss)
                strategy.backward(loss)
                for cb in hooks["on_after_backward"]:
                    cb.on_after_backward(trainer, module)
        trainer._batches_in_epoch = batch_idx = batch_idx + 1
        if boundary:
            _optimizer_step(trainer)
        for cb in hooks["on_train_batch_end"]:
            cb.on_train_batch_end(trainer, module, output, batch, batch_idx - 1)
        if val_every and batch_idx % val_every == 0:
            run_validation(trainer)
            metrics.stage = "train"
        if trainer.max_steps >= 0 and trainer.global_step >= trainer.max_steps:
            trainer.should_stop = True
        if trainer.should_stop:
            break
    if math.isinf(num_batches) or batch_idx >= num_batches:
        _end_train_epoch(trainer)


def _optimizer_step(trainer: Trainer) -> None:
    strategy = trainer.strategy
    module = trainer.model
    hooks = trainer._hooks
    for optimizer in trainer.optimizers:
        if trainer.gradient_clip_val is not None:
            if trainer.gradient_clip_algorithm == "norm":
                strategy.clip_gradients_norm(optimizer, trainer.gradient_clip_val)
            else:
                strategy.unscale_gradients(optimizer)
                params = [p for group in optimizer.param_groups for p in group["params"]]
                torch.nn.utils.clip_grad_value_(params, trainer.gradient_clip_val)
        for cb in hooks["on_before_optimizer_step"]:
            cb.on_before_optimizer_step(trainer, module, optimizer)
        strategy.optimizer_step(optimizer)
        optimizer.zero_grad(set_to_none=True)
    trainer.global_step += 1
    step = trainer.global_step
    for config in trainer.lr_scheduler_configs:
        if config.interval == "step" and step % config.frequency == 0:
            config.step(trainer.callback_metrics)
    if step % trainer.log_every_n_steps == 0:
        values = trainer._metrics.pop_step_log()
        if values:
            trainer._log_metrics(values)


def _end_train_epoch(trainer: Trainer) -> None:
    """Epoch-level metrics, epoch schedulers, then the epoch-end hooks (checkpoints save here)."""
    trainer._epoch_finished = True
    trainer._metrics.stage = "train"
    values = trainer._metrics.reduce_epoch("train")
    if values:
        trainer._log_metrics(values)
    epoch = trainer.current_epoch
    for config in trainer.lr_scheduler_configs:
        if config.interval == "epoch" and (epoch + 1) % config.frequency == 0:
            config.step(trainer.callback_metrics)
    trainer.model.on_train_epoch_end()
    trainer._call("on_train_epoch_end")
    trainer.current_epoch += 1
    trainer._batches_in_epoch = 0
    trainer._epoch_finished = False


@torch.no_grad()
def run_validation(trainer: Trainer) -> dict[str, float]:
    """One pass over the validation data; returns the epoch-level validation metrics."""
    loader = trainer._val_loader
    if loader is None or trainer.num_val_batches == 0:
        return {}
    strategy = trainer.strategy
    module = trainer.model
    hooks = trainer._hooks
    metrics = trainer._metrics
    was_training = module.training
    metrics.stage = "val"
    module.eval()
    trainer._call("on_validation_start")
    trainer._call("on_validation_epoch_start")
    iterator = loader.iterate(0)
    batch_idx = 0
    while batch_idx < trainer.num_val_batches:
        try:
            batch = next(iterator)
        except StopIteration:
            break
        batch = strategy.batch_to_device(batch)
        for cb in hooks["on_validation_batch_start"]:
            cb.on_validation_batch_start(trainer, module, batch, batch_idx)
        output = strategy.validation_step(batch, batch_idx)
        for cb in hooks["on_validation_batch_end"]:
            cb.on_validation_batch_end(trainer, module, output, batch, batch_idx)
        batch_idx += 1
    values = metrics.reduce_epoch("val")
    if values:
        trainer._log_metrics(values)
    module.on_validation_epoch_end()
    trainer._call("on_validation_epoch_end")
    trainer._call("on_validation_end")
    module.train(was_training)
    return values
