"""The training loop the Trainer runs (evaluation loops are in ``evaluation.py``).

Hooks are called in Lightning 2.x's order (recorded from Lightning in tests/porting/expected/;
docs/lightning.md lists it): for each batch ``on_train_batch_start``, ``training_step``, on the
first micro-batch of an accumulation window ``on_before_zero_grad`` and ``zero_grad``, then
``on_before_backward``, ``backward``, ``on_after_backward``, on the last micro-batch
``on_before_optimizer_step``, clipping and ``optimizer.step()``, then ``on_train_batch_end``,
step metrics to the loggers, and validation when due.

The hot path (one micro-batch) stays lean: hook dispatch goes only to callbacks and module
methods that override a hook (see ``Trainer._hooks``), so idle hooks cost nothing per step. A
checkpoint written in the background (``async_save``) costs an attribute read per optimizer step;
its failure is raised there, at a step every rank agrees on ([Note: failures surface at the same
step on every rank] in fullshard.checkpoint.async_save).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from fullshard.errors import MisconfigurationError
from fullshard.launch import stuck_ranks
from fullshard.rank_zero import rank_zero_warn
from fullshard.trainer import checkpointing, evaluation

if TYPE_CHECKING:
    from fullshard.module import Module
    from fullshard.trainer.preflight import DataSources
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


def _batch_outputs(output: Any, loss: torch.Tensor | None) -> Any:
    """What ``on_train_batch_end`` receives, as in Lightning: a dict with the (normalised,
    detached) ``"loss"`` and the other entries of a dict result; None for a skipped step."""
    if loss is None:
        return None
    outputs = {k: v for k, v in output.items() if k != "loss"} if isinstance(output, Mapping) else {}
    outputs["loss"] = loss.detach()
    return outputs


def run_fit(
    trainer: Trainer, module: Module, sources: DataSources, checkpoint: dict[str, Any] | None
) -> None:
    """Sanity validation, then training until ``max_steps``/``max_epochs`` or a stop request.

    Loaders are asked for in Lightning's order: the validation loader when the sanity run
    starts, the training loader after it (without a sanity run: training, then validation).
    A resumed run gets its random-number states back only then, so building the loaders
    (a ``random_split`` in ``train_dataloader()``, say) cannot shift them.
    """
    if trainer._pending_loop_state is not None:
        trainer._restore_loop_state(trainer._pending_loop_state, epoch_end_pending=True)
        trainer._pending_loop_state = None
    sanity_ran = evaluation.run_sanity_check(trainer, module, sources)
    trainer._setup_fit_train_data(module, sources)
    if not sanity_ran:
        trainer._setup_val_data(module, sources)
    trainer._finish_epoch_restore()
    trainer._val_check_batch = trainer._compute_val_check_batch()
    _warn_if_nothing_logged(trainer)
    if checkpoint is not None:
        checkpointing.restore_rng_states(trainer, checkpoint)
    trainer._call("on_train_start")
    while not trainer._done():
        run_train_epoch(trainer)
    trainer._call("on_train_end")


def _warn_if_nothing_logged(trainer: Trainer) -> None:
    """Say, as Lightning does, when the steps of the run (or of an epoch) are fewer than
    ``log_every_n_steps``: their step metrics would never reach the loggers."""
    if not trainer.loggers or trainer.fast_dev_run:
        return
    steps = trainer.num_training_batches / trainer.accumulate_grad_batches  # inf: an iterable dataset
    what = f"The training epoch has {math.ceil(steps) if not math.isinf(steps) else steps} optimizer step(s)"
    if trainer.max_steps >= 0 and trainer.max_steps - trainer.global_step < steps:
        steps = trainer.max_steps - trainer.global_step
        what = f"This run has {steps} optimizer step(s) left (max_steps={trainer.max_steps})"
    if 0 < steps < trainer.log_every_n_steps:
        rank_zero_warn(
            f"{what}, fewer than Trainer(log_every_n_steps={trainer.log_every_n_steps}): step metrics are logged "
            "every log_every_n_steps steps, so they will not reach the loggers (epoch metrics still do). Pass a "
            "lower log_every_n_steps to see them.",
            stacklevel=3,
        )


def run_train_epoch(trainer: Trainer) -> None:
    """One epoch (or its remainder, when resuming mid-epoch)."""
    strategy = trainer.strategy
    module = trainer.lightning_module
    metrics = trainer._metrics
    loader = trainer._train_loader
    assert loader is not None
    num_batches = trainer.num_training_batches
    start = trainer._batches_in_epoch
    trainer.batch_idx_start = start
    accumulate = trainer.accumulate_grad_batches
    hooks = trainer._hooks
    module_batch_start = trainer._module_hook("on_train_batch_start")  # its result counts: called apart
    batch_start_callbacks = [h for h in hooks["on_train_batch_start"] if h != module_batch_start]
    batch_end = hooks["on_train_batch_end"]
    zero_grad_hooks = hooks["on_before_zero_grad"]
    before_backward = hooks["on_before_backward"]
    after_backward = hooks["on_after_backward"]
    nonfinite = trainer._nonfinite  # Trainer(on_nonfinite_loss=...), see fullshard.trainer.nonfinite
    nonfinite.reset()

    metrics.stage = "train"
    metrics.in_step = False
    trainer._resume_point = None
    module.train()
    trainer._call("on_train_epoch_start")
    metrics.in_step = True
    iterator = loader.iterate(trainer.current_epoch, trainer._epoch_start)
    batch_idx = start
    while batch_idx < num_batches:
        try:
            batch = next(iterator)
        except StopIteration:
            strategy.check_rank_agreement(
                "end_of_data", str(batch_idx), f"the training data ended after {batch_idx} batches"
            )
            break
        stuck_ranks.kick("train", batch_idx)  # [Note: stuck ranks] in fullshard.launch.stuck_ranks
        batch = strategy.batch_to_device(batch)
        metrics.set_batch(batch)
        trainer.is_last_batch = batch_idx + 1 == num_batches
        for hook in batch_start_callbacks:
            hook(batch, batch_idx)
        if module_batch_start is not None and module_batch_start(batch, batch_idx) == -1:
            break  # Lightning's contract: -1 skips the rest of the epoch
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
                nonfinite.observe(loss, batch_idx)
                if batch_idx % accumulate == 0:
                    for optimizer in trainer.optimizers:
                        for hook in zero_grad_hooks:
                            hook(optimizer)
                        optimizer.zero_grad(set_to_none=True)
                if accumulate > 1:
                    loss = loss / accumulate
                for hook in before_backward:
                    hook(loss)
                strategy.backward(loss)
                for hook in after_backward:
                    hook()
        trainer._batches_in_epoch = batch_idx = batch_idx + 1
        trainer._total_batch_idx += 1
        stepped = boundary and loss is not None and nonfinite.step_allowed(trainer)
        if stepped:
            _optimizer_step(trainer)
        # at every boundary, stepped or skipped: see [Note: preemption, agreed without a per-step ...]
        if boundary and trainer._preemption.requested and trainer._preemption.should_stop(trainer._total_batch_idx):
            trainer._preemption.save_and_exit(trainer)
        if stepped and strategy.pending_checkpoint is not None:  # a checkpoint written in the background
            strategy.pending_checkpoint.step_boundary(trainer.global_step)  # raises if it failed
        if batch_end:
            outputs = _batch_outputs(output, loss)
            for hook in batch_end:
                hook(outputs, batch, batch_idx - 1)
        if boundary:
            _log_step_metrics(trainer)
        if trainer._should_validate(batch_idx):
            if boundary:
                module.zero_grad(set_to_none=True)  # free gradient memory for the evaluation
            evaluation.run_validation(trainer)
            metrics.stage = "train"
            metrics.set_batch(batch)
        if boundary:
            _step_schedulers(trainer, "step", plateau=True)
            trainer._batches_that_stepped += 1
        if trainer.max_steps >= 0 and trainer.global_step >= trainer.max_steps:
            break
        if trainer._stop_requested():
            break
    _end_train_epoch(trainer)


def _optimizer_step(trainer: Trainer) -> None:
    strategy = trainer.strategy
    before_step = trainer._hooks["on_before_optimizer_step"]
    for optimizer in trainer.optimizers:
        for hook in before_step:
            hook(optimizer)
        if trainer.gradient_clip_val is not None:
            if trainer.gradient_clip_algorithm == "norm":
                strategy.clip_gradients_norm(optimizer, trainer.gradient_clip_val)
            else:
                strategy.unscale_gradients(optimizer)
                params = [p for group in optimizer.param_groups for p in group["params"]]
                torch.nn.utils.clip_grad_value_(params, trainer.gradient_clip_val)
        strategy.optimizer_step(optimizer)
    trainer.global_step += 1
    _step_schedulers(trainer, "step", plateau=False)
    if trainer.is_last_batch:
        _step_schedulers(trainer, "epoch", plateau=False)


def _step_schedulers(trainer: Trainer, interval: str, *, plateau: bool) -> None:
    """Step the schedulers of ``interval`` that are (or are not) ``ReduceLROnPlateau``, as
    Lightning orders them: plateau ones after the validation that produces their metric."""
    for config in trainer.lr_scheduler_configs:
        if config.interval != interval or config.is_plateau != plateau:
            continue
        count = trainer.global_step if interval == "step" else trainer.current_epoch + 1
        if count % config.frequency == 0:
            config.step(trainer.callback_metrics)


def _log_step_metrics(trainer: Trainer) -> None:
    step = trainer._batches_that_stepped
    if (step + 1) % trainer.log_every_n_steps == 0 or trainer.should_stop or trainer.fast_dev_run:
        values = trainer._metrics.pop_step_log()
        if values:
            trainer._log_metrics(values, step)


def _end_train_epoch(trainer: Trainer) -> None:
    """Epoch-level metrics, the epoch-end hooks (checkpoints save here), then epoch schedulers.

    [Note: epochs cut short]
    An epoch that ends early (``max_steps``, a stop request, ``on_train_batch_start`` returning
    -1) still ends as in Lightning: its epoch-end hooks run and ``current_epoch`` moves on. A
    checkpoint written then or afterwards still records the position inside the cut epoch (the
    batches and the samples consumed), so ``fit(ckpt_path=...)`` with a larger ``max_steps``
    continues exactly where training stopped, on any number of processes.
    """
    metrics = trainer._metrics
    cut_short = not math.isinf(trainer.num_training_batches) and (
        trainer._batches_in_epoch < trainer.num_training_batches
    )
    trainer._resume_point = (
        (trainer.current_epoch, trainer._batches_in_epoch, trainer._samples_in_epoch()) if cut_short else None
    )
    trainer._epoch_finished = not cut_short
    metrics.stage = "train"
    metrics.in_step = False
    metrics.reduce_epoch("train")
    trainer._call("on_train_epoch_end")
    values = metrics.pop_epoch_log()
    if values:
        trainer._log_metrics(values, max(trainer._batches_that_stepped - 1, 0))
    _step_schedulers(trainer, "epoch", plateau=True)
    metrics.in_step = True
    trainer.current_epoch += 1
    trainer._batches_in_epoch = 0
    trainer._epoch_start = (0, 0)
    trainer._epoch_finished = False
    if math.isinf(trainer.num_training_batches):
        trainer.is_last_batch = False
