"""The training loop of ``fit``: sanity validation, epochs of training steps, validation when due.

Hooks are called in Lightning 2.x's order (recorded from Lightning in tests/porting/expected/;
docs/lightning.md lists it): for each batch ``on_train_batch_start``, ``training_step``, on the
first micro-batch of an accumulation window ``on_before_zero_grad`` and ``zero_grad``, then
``on_before_backward``, ``backward``, ``on_after_backward``, on the last micro-batch
``on_before_optimizer_step``, clipping and ``optimizer.step()``, then ``on_train_batch_end``,
step metrics to the loggers, and validation when due.

A module with ``automatic_optimization = False``, or one that overrides ``optimizer_step``,
``optimizer_zero_grad``, ``backward`` or ``configure_gradient_clipping``, has its batches run by
:mod:`fullshard.trainer.optimization` instead ([Note: three ways through a training batch]).

The hot path (one micro-batch) stays lean: hook dispatch goes only to callbacks and module
methods that override a hook (see :class:`~fullshard.trainer.hooks.Hooks`), so idle hooks cost
nothing per step. A checkpoint written in the background (``async_save``) costs an attribute read
per optimizer step; its failure is raised there, at a step every rank agrees on ([Note: failures
surface at the same step on every rank] in fullshard.checkpoint.async_save).

The loop owns its state: the :class:`Progress` record, the training loader and its batch count,
the preemption and non-finite-loss handling. It reads the Trainer's public settings only.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from fullshard.launch import stuck_ranks
from fullshard.module import Module
from fullshard.rank_zero import PossibleUserWarning, rank_zero_info, rank_zero_warn
from fullshard.seed import current_seed, rng_states, set_rng_states
from fullshard.trainer import data_setup, nonfinite, preemption
from fullshard.trainer.combined_loader import PreparedCombined
from fullshard.trainer.data import EpochDraws
from fullshard.trainer.loggers.dispatch import send_to_loggers
from fullshard.trainer.loops import resume, step_output
from fullshard.trainer.loops.fetcher import Fetcher
from fullshard.trainer.loops.progress import Progress
from fullshard.trainer.loops.sanity_check import run_sanity_check
from fullshard.trainer.loops.scheduler_stepping import SchedulerStepping
from fullshard.trainer.optimization import Optimization

if TYPE_CHECKING:
    import signal

    from fullshard.trainer.data import PreparedLoader
    from fullshard.trainer.hooks import Hooks, StrategySteps
    from fullshard.trainer.loops.evaluation_loop import EvaluationLoop
    from fullshard.trainer.metrics import MetricsCollector
    from fullshard.trainer.preflight import DataSources
    from fullshard.trainer.trainer import Trainer


class FitLoop:
    """Runs ``fit``'s training, and owns where it is (:attr:`progress`)."""

    def __init__(
        self,
        trainer: Trainer,
        metrics: MetricsCollector,
        validate_loop: EvaluationLoop,
        *,
        on_nonfinite_loss: nonfinite.NonFiniteLoss,
        preemption_signals: tuple[signal.Signals, ...],
        requeue_on_preemption: bool,
    ) -> None:
        self.trainer = trainer
        self.metrics = metrics
        self.validate_loop = validate_loop
        self.progress = Progress()
        self.optimization = Optimization(trainer, self.progress)
        self.schedulers = SchedulerStepping(trainer, self.progress, self.optimization)
        self.train_loader: PreparedLoader | PreparedCombined | None = None
        self.num_training_batches: int | float = 0
        self.val_check_batch: int | float = 0
        self.nonfinite = on_nonfinite_loss  # [Note: agreeing on a non-finite loss]
        self.preemption_signals = preemption_signals
        self.requeue_on_preemption = requeue_on_preemption
        # what the loop reads at each boundary; a live one is made for each fit
        self.preemption = preemption.Preemption((), requeue=False)
        self.early_loader: Any = None  # the given training loader, while rank 0 checks optimizers early
        self._hooks: Hooks | None = None
        self.reload = data_setup.ReloadSchedule()  # reload_dataloaders_every_n_epochs; made for each fit
        self._announced = False
        # the run's first epoch, made before on_train_start (with the loader it reads)
        self._first_batches: tuple[Any, Fetcher] | None = None
        self._next_draws: EpochDraws | None = None  # see draw_next_epoch_from
        # the strategy and backward hooks of the usual batch, read once an epoch (_start_epoch)
        self._backward_parts: tuple[Any, ...] = ()

    # --------------------------------------------------------------------------- data
    def setup_train_loader(self, loader: Any) -> None:
        """Prepare the training loader (``estimated_stepping_batches`` may ask for it early)."""
        self.train_loader, self.num_training_batches = data_setup.prepare(self.trainer, loader, "train")
        self._next_draws = None
        self._announced = False  # warn_if_few_batches has not looked at it yet

    def estimated_stepping_batches(self, train_loader: Callable[[], Any] | None) -> int | float:
        """The number of optimizer steps ``fit`` will take, as Lightning estimates it.
        ``train_loader`` builds the running fit's training loader when needed (None outside fit)."""
        trainer = self.trainer
        if trainer.max_epochs == -1:
            return math.inf if trainer.max_steps == -1 else trainer.max_steps
        if self.train_loader is None:
            if self.early_loader is not None:  # before any process starts (preflight)
                self.setup_train_loader(self.early_loader)
            elif train_loader is not None:
                rank_zero_info("Building the training dataloader to estimate the number of stepping batches.")
                self.setup_train_loader(train_loader())
            else:
                raise RuntimeError(
                    "estimated_stepping_batches needs the training dataloader: read it inside fit() "
                    "(e.g. in configure_optimizers)."
                )
        total = self.num_training_batches
        if math.isinf(total):
            return trainer.max_steps if trainer.max_steps != -1 else math.inf
        steps = math.ceil(total / trainer.accumulate_grad_batches) * max(trainer.max_epochs, 1)
        return min(steps, trainer.max_steps) if trainer.max_steps != -1 else steps

    def _setup_train_data(self, module: Module, sources: DataSources) -> None:
        """The training loader of ``fit`` (asked for after the sanity validation, as in Lightning)."""
        if self.trainer.limit_train_batches == 0:  # not even asked for, as in Lightning
            self.train_loader, self.num_training_batches = None, 0
        elif self.train_loader is None:
            self.setup_train_loader(sources.get("train", module))
        if self.num_training_batches == 0 and self.trainer.limit_train_batches != 0:
            # a warning came with the empty loader (data_setup.prepare); as Lightning, an info line
            rank_zero_info("fit stops: the training dataloader has no batches.")
        data_setup.check_same_batch_count(self.trainer.strategy, self.num_training_batches, "training")
        if self.num_training_batches:
            data_setup.check_interval_fits(self.trainer, self.num_training_batches)

    # ------------------------------------------------------------------ checkpointed state
    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's ``"loops"`` entry."""
        loader = self.train_loader
        positions = loader.state if isinstance(loader, PreparedCombined) else None
        return self.progress.state_dict(
            resume.samples_in_epoch(self.progress, self.train_loader),
            loader.seed if loader is not None else current_seed(),
            positions,
            loader.order_state if loader is not None else None,
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Keep a checkpoint's loop state (with its ``world_size``) until the loop starts: it is
        put back after ``on_fit_start``, as in Lightning."""
        self.progress.pending = state

    def snapshot(self) -> tuple[Any, ...]:
        """What a tuner's trial run changes here, for :meth:`restore` (see fullshard.tuner.search)."""
        settings = (self.train_loader, self.num_training_batches, self.val_check_batch, self.preemption)
        return (self.progress.snapshot(), self._hooks, self.reload, *settings)

    def restore(self, snapshot: tuple[Any, ...], module: Module) -> None:
        """Put back what :meth:`snapshot` recorded (searched inside training: its hooks again)."""
        progress, self._hooks, self.reload, self.train_loader, *settings = snapshot
        self.num_training_batches, self.val_check_batch, self.preemption = settings
        self.progress.restore(progress)
        if self._hooks is not None:
            self.optimization.setup(module, self._hooks, self.nonfinite)

    # ------------------------------------------------------------------------- stopping
    def can_stop_early(self) -> bool:
        """Whether ``min_epochs`` and ``min_steps`` are reached."""
        trainer, progress = self.trainer, self.progress
        min_epochs = trainer.min_epochs
        if min_epochs is None and trainer.min_steps is not None:
            min_epochs = 1  # Lightning's rule: min_steps alone also asks for one whole epoch
        epochs_ok = min_epochs is None or progress.epoch >= min_epochs  # finished epochs
        steps_ok = trainer.min_steps is None or progress.global_step >= trainer.min_steps
        return epochs_ok and steps_ok

    def stop_requested(self) -> bool:
        return self.trainer.should_stop and self.can_stop_early()

    def done(self) -> bool:
        trainer, progress = self.trainer, self.progress
        if self.num_training_batches == 0:
            return True
        if trainer.max_steps >= 0 and progress.global_step >= trainer.max_steps:
            return True
        if trainer.max_epochs >= 0 and progress.epoch >= trainer.max_epochs:
            return True
        # a stop request waits for min_epochs/min_steps; should_stop stays set meanwhile (so step
        # metrics are logged every step, as Lightning 2.6.6 does)
        return self.stop_requested()

    def should_validate(self, batches_done: int) -> bool:
        """Whether validation runs after the ``batches_done``-th batch of this epoch (Lightning's rule)."""
        every = self.val_check_batch
        if not every:
            return False
        n_epoch = self.trainer.check_val_every_n_epoch
        if n_epoch is not None and (self.progress.epoch + 1) % n_epoch != 0:
            return False
        if self.stop_requested():
            return True
        if math.isinf(every):
            return self.trainer.is_last_batch
        count = self.progress.total_batch_idx if n_epoch is None else batches_done
        return count % every == 0  # type: ignore[operator]

    # --------------------------------------------------------------------------- running
    def run(
        self, module: Module, sources: DataSources, checkpoint: dict[str, Any] | None, hooks: Hooks
    ) -> None:
        """Sanity validation, then training until ``max_steps``/``max_epochs`` or a stop request,
        with the preemption signals handled meanwhile.

        Loaders are asked for in Lightning's order: the validation loader when the sanity run
        starts, the training loader after it (without a sanity run: training, then validation).
        A resumed run gets its random-number states back only then, so building the loaders
        (a ``random_split`` in ``train_dataloader()``, say) cannot shift them.
        """
        trainer, progress = self.trainer, self.progress
        self._hooks = hooks
        self.optimization.setup(module, hooks, self.nonfinite)
        self.preemption = preemption.Preemption(self.preemption_signals, self.requeue_on_preemption)
        if self.preemption_signals:
            self.preemption.start(trainer)
        try:
            if progress.pending is not None:
                progress.load_state_dict(progress.pending)
                progress.pending = None
            states = rng_states()  # the sanity run draws nothing from the run's streams, as in Lightning
            sanity_ran = run_sanity_check(trainer, self.validate_loop, self.metrics, module, sources, hooks)
            set_rng_states(states)
            self._setup_train_data(module, sources)
            # counted from current_epoch as the loaders were built (before an epoch the checkpoint
            # ended is moved past), as Lightning counts
            self.reload = data_setup.ReloadSchedule(
                trainer.reload_dataloaders_every_n_epochs, progress.epoch, module, sources
            )
            resume.place_restored_position(self.progress, self.train_loader)
            if self.done():  # no batches, or max_steps/max_epochs reached already
                return  # as in Lightning: no on_train_start, no epoch, no on_train_end
            if not sanity_ran:
                self.validate_loop.setup_data(module, sources)
            # Lightning makes the first epoch's iterator here, before on_train_start (see
            # [Note: fetching a batch ahead] in fetcher.py). A checkpoint written inside the
            # epoch was written after it, with the states its draws left: they come back after
            # it (which draws what the epoch drew); one written between epochs, before it, which
            # then draws from them ([Note: the epoch's draws] in fullshard.trainer.data)
            inside_epoch = progress.epoch_start != (0, 0)
            if checkpoint is not None and not inside_epoch:
                trainer.checkpoint_manager.restore_rng_states(checkpoint)
            self._first_batches = (self.train_loader, self._epoch_batches())
            validate = self.validate_loop
            self.val_check_batch = data_setup.val_check_batch(
                trainer, validate.num_batches if validate.loader is not None else 0, self.num_training_batches
            )
            if not self._announced:  # (a tuner's search announced the loader it rebuilt)
                self.warn_if_few_batches()
            if checkpoint is not None and inside_epoch:
                trainer.checkpoint_manager.restore_rng_states(checkpoint)
            hooks.call("on_train_start")
            while not self.done():
                if self.reload.before_epoch(self):  # reload_dataloaders_every_n_epochs
                    self._iterate_rebuilt_loader()
                with trainer.profiler.profile("run_training_epoch"):  # [Note: profiling at the dispatch]
                    self.run_epoch()
            hooks.call("on_train_end")
        finally:
            self._first_batches = None
            self.preemption.stop()

    def warn_if_few_batches(self) -> None:
        """Say when an epoch has fewer batches than ``log_every_n_steps``, by Lightning's rule:
        each time a fit builds its training loader (at the start, and at each reload), with a
        logger, outside ``fast_dev_run``. Such step metrics may never reach the loggers, yet a
        short run is often meant: a PossibleUserWarning."""
        trainer = self.trainer
        batches = self.num_training_batches  # inf for an iterable dataset: never fewer
        if trainer.loggers and not trainer.fast_dev_run and 0 < batches < trainer.log_every_n_steps:
            rank_zero_warn(
                f"The training epoch has {batches} batch(es), fewer than Trainer(log_every_n_steps="
                f"{trainer.log_every_n_steps}): step metrics are sent every log_every_n_steps steps, so "
                "those of a short run may never reach the loggers (epoch metrics do). Pass a lower "
                "log_every_n_steps to see them.",
                PossibleUserWarning,
                stacklevel=1,
            )
        self._announced = True

    def run_epoch(self) -> None:
        """One epoch (or its remainder, when resuming mid-epoch).

        [Note: the per-batch path]
        The loop below is what every batch runs, flat: it makes no call that the work does not
        need (one into :meth:`_automatic_batch` for the usual batch, which calls
        ``training_step``). What runs once an epoch or rarely (the epoch's start, data running
        out, ``on_train_batch_start`` returning -1, validation) is in methods of its own.
        """
        trainer, progress, metrics = self.trainer, self.progress, self.metrics
        hooks = self._hooks
        assert hooks is not None and self.train_loader is not None
        steps, num_batches = hooks.steps, self.num_training_batches
        module_batch_start = hooks.module_hook("on_train_batch_start")  # its result counts: called apart
        batch_start_callbacks = [h for h in hooks["on_train_batch_start"] if h != module_batch_start]
        batch_end = hooks["on_train_batch_end"]
        preempt = self.preemption
        manual, with_hooks = self.optimization.manual, self.optimization.uses_hooks
        batch_idx = progress.batches_in_epoch
        iterator, accumulate = self._start_epoch(hooks, batch_idx)
        ended_by_hook = False
        while batch_idx < num_batches:
            try:
                batch = next(iterator)
            except StopIteration:
                self._data_ended(batch_idx)
                break
            stuck_ranks.kick("train", batch_idx)  # [Note: stuck ranks] in fullshard.launch.stuck_ranks
            batch = steps.batch_to_device(batch)
            metrics.set_batch(batch)
            trainer.is_last_batch = iterator.done if iterator.ahead else batch_idx + 1 == num_batches
            for hook in batch_start_callbacks:
                hook(batch, batch_idx)
            if module_batch_start is not None and module_batch_start(batch, batch_idx) == -1:
                ended_by_hook = self._end_epoch_at_batch(batch_idx)
                break
            # Lightning steps on the last batch
            boundary = (batch_idx + 1) % accumulate == 0 or trainer.is_last_batch
            # [Note: three ways through a training batch] in fullshard.trainer.optimization
            if manual or with_hooks:
                output, loss, stepped = self._module_driven_batch(steps, batch, batch_idx, boundary)
            else:
                output, loss, stepped = self._automatic_batch(steps, batch, batch_idx, boundary, accumulate)
            progress.batches_in_epoch = batch_idx = batch_idx + 1
            progress.total_batch_idx += 1
            if stepped and not manual:
                if not with_hooks:
                    self._optimizer_step(hooks)
                progress.global_step += 1
                self.schedulers.step("step", plateau=False, count=batch_idx)
            if trainer.is_last_batch and not manual:
                self.schedulers.step("epoch", plateau=False)
            # at every boundary, stepped or skipped: see
            # [Note: preemption, agreed without a per-step collective] in fullshard.trainer.preemption
            if boundary and preempt.requested and preempt.should_stop(progress.total_batch_idx):
                preempt.save_and_exit(trainer)
            if stepped:  # a checkpoint written in the background raises here if it failed
                trainer.checkpoint_manager.step_boundary(progress.global_step)
            if batch_end:
                outputs = output if manual else step_output.batch_outputs(output, loss)
                for hook in batch_end:
                    hook(outputs, batch, batch_idx - 1)
            metrics.commit()  # [Note: committed metrics] in fullshard.trainer.metrics
            if boundary:
                self._log_step_metrics()
            if self.should_validate(batch_idx):
                self._validate_in_epoch(hooks, batch, boundary)
            if boundary:
                if not manual:
                    self.schedulers.step("step", plateau=True, count=batch_idx)
                progress.batches_that_stepped += 1
            if (
                trainer.max_steps >= 0 and progress.global_step >= trainer.max_steps
            ) or self.stop_requested():
                break
        self._end_epoch(hooks, ended_by_hook)

    def _start_epoch(self, hooks: Hooks, start: int) -> tuple[Fetcher, int]:
        """Start an epoch at its ``start``-th batch: the metrics' stage, ``on_train_epoch_start``,
        and the epoch's batches; returns them with ``accumulate_grad_batches``."""
        trainer, metrics = self.trainer, self.metrics
        trainer.batch_idx_start = start
        self.nonfinite.reset()
        metrics.stage = "train"
        metrics.in_step = False
        self.progress.resume_point = None
        # No module.train() here, as in Lightning 2.x: a submodule the user put in eval mode (a
        # frozen backbone's BatchNorm) stays so; evaluation runs put back every submodule's mode.
        hooks.call("on_train_epoch_start")
        accumulate = trainer.accumulate_grad_batches  # after the hook: GradientAccumulationScheduler sets it
        metrics.in_step = True
        first, self._first_batches = self._first_batches, None
        # unless reload_dataloaders_every_n_epochs rebuilt the loader since
        iterator = first[1] if first is not None and first[0] is self.train_loader else self._epoch_batches()
        self._backward_parts = (
            trainer.strategy,
            hooks["on_before_zero_grad"],
            hooks["on_before_backward"],
            hooks["on_after_backward"],
        )
        return iterator, accumulate

    def _data_ended(self, batch_idx: int) -> None:
        """The training data ran out before the epoch's expected batch count: every rank must agree."""
        self.trainer.strategy.check_rank_agreement(
            "end_of_data", str(batch_idx), f"the training data ended after {batch_idx} batches"
        )

    def _end_epoch_at_batch(self, batch_idx: int) -> bool:
        """``on_train_batch_start`` returned -1: Lightning's contract skips the rest of the epoch;
        the batch counts as the epoch's last for the schedulers ([Note: when schedulers step])."""
        if not self.optimization.manual:
            self.schedulers.step("step", plateau=False, count=batch_idx + 1)
            self.schedulers.step("epoch", plateau=False)
        return True

    def _module_driven_batch(
        self, steps: StrategySteps, batch: Any, batch_idx: int, boundary: bool
    ) -> tuple[Any, torch.Tensor | None, bool]:
        """A batch run under manual optimization or the module's own optimization hooks (see
        [Note: three ways through a training batch] in fullshard.trainer.optimization): its
        output, loss and whether an optimizer stepped."""
        optimization = self.optimization
        if optimization.manual:
            return optimization.manual_batch(batch, batch_idx), None, True
        return optimization.automatic_batch(
            batch,
            batch_idx,
            boundary,
            functools.partial(self._training_step, steps, batch, batch_idx, boundary),
        )

    def _validate_in_epoch(self, hooks: Hooks, batch: Any, boundary: bool) -> None:
        """Validation due after a training batch, then back to training with that batch's metrics."""
        if boundary:
            self.trainer.lightning_module.on_validation_model_zero_grad()  # default: free gradient memory for the evaluation
        self.reload.before_validation(self)  # reload_dataloaders_every_n_epochs
        self.validate_loop.run(hooks)
        self.metrics.stage = "train"
        self.metrics.set_batch(batch)

    def _iterate_rebuilt_loader(self) -> None:
        """Make a rebuilt training loader's iterator at once, as Lightning does when it rebuilds
        it (before ``on_train_epoch_start``). In the run's first epoch that iterator is the
        epoch's; in a later one Lightning makes another when the epoch starts and drops this
        one, whose draws from the global generator still count ([Note: the epoch's draws] in
        fullshard.trainer.data): a ported script sees the same orders and random numbers."""
        batches = self._epoch_batches()
        if self._first_batches is not None:
            self._first_batches = (self.train_loader, batches)

    def draw_next_epoch_from(self, rng_state: torch.Tensor) -> None:
        """Make the next epoch's iterator from ``rng_state`` (the global generator then put back),
        as if it had been made then: Lightning's learning-rate finder makes the rebuilt loader's
        iterator at the end of its search, inside its ``isolate_rng`` block, and the fit keeps it."""
        self._next_draws = EpochDraws(rng_state, None)

    def _epoch_batches(self) -> Fetcher:
        """The batches of this epoch (its rest, when resuming), fetched a batch ahead when their
        number is unknown ([Note: fetching a batch ahead] in fetcher.py)."""
        assert self.train_loader is not None
        progress = self.progress
        resumed, progress.resumed_draws = progress.resumed_draws, None
        if resumed is not None and progress.epoch_start == (0, 0):
            resumed = None  # the epoch starts afresh: it draws anew
        if resumed is None:
            resumed, self._next_draws = self._next_draws, None
        # what the epoch draws, for a checkpoint written inside it ([Note: the epoch's draws])
        progress.epoch_rng_state = torch.get_rng_state() if resumed is None else resumed.rng_state
        iterator = self.train_loader.iterate(progress.epoch, progress.epoch_start, resumed)
        return Fetcher(iterator, ahead=math.isinf(self.num_training_batches))

    def _automatic_batch(
        self, steps: StrategySteps, batch: Any, batch_idx: int, boundary: bool, accumulate: int
    ) -> tuple[Any, torch.Tensor | None, bool]:
        """The usual batch: ``training_step``, ``zero_grad`` at an accumulation window's first
        batch, ``backward``; returns the output, the loss and whether the optimizer steps (the
        caller steps it). It calls ``training_step`` itself, as :meth:`_training_step` does, so
        that the per-batch path makes no extra call ([Note: the per-batch path])."""
        trainer, nonfinite_check = self.trainer, self.nonfinite
        strategy, zero_grad_hooks, before_backward, after_backward = self._backward_parts
        # [Note: a training step that returns None] in step_output.py
        with strategy.no_backward_sync(enabled=not boundary):
            output = steps.training_step(batch, batch_idx)
            loss = step_output.extract_loss(output)
            if loss is None:
                self._agree_on_missing_loss(batch_idx, boundary)
            else:
                nonfinite_check.observe(loss, batch_idx)
            if batch_idx % accumulate == 0:
                for optimizer in trainer.optimizers:
                    for hook in zero_grad_hooks:
                        hook(optimizer)
                    optimizer.zero_grad(set_to_none=True)
            if loss is not None:
                if accumulate > 1:
                    loss = loss / accumulate
                for hook in before_backward:
                    hook(loss)
                steps.backward(loss)
                for hook in after_backward:
                    hook()
        return output, loss, boundary and nonfinite_check.step_allowed(trainer)

    def _training_step(
        self, steps: StrategySteps, batch: Any, batch_idx: int, boundary: bool
    ) -> tuple[Any, torch.Tensor | None]:
        """``training_step`` and its loss, for the module's own optimization hooks."""
        output = steps.training_step(batch, batch_idx)
        loss = step_output.extract_loss(output)
        if loss is None:
            self._agree_on_missing_loss(batch_idx, boundary)
        return output, loss

    def _agree_on_missing_loss(self, batch_idx: int, boundary: bool) -> None:
        """A batch without a loss (``training_step`` returned None) is agreed on by every rank
        (see [Note: a training step that returns None] in step_output.py)."""
        step_output.warn_none_once()
        epoch = self.progress.epoch
        self.trainer.strategy.check_rank_agreement(
            "skip",
            f"{epoch}:{batch_idx}",
            f"training_step returned None at epoch {epoch}, batch {batch_idx}",
        )
        if boundary:
            step_output.refuse_unsynchronised_window(self.trainer, batch_idx)

    def _optimizer_step(self, hooks: Hooks) -> None:
        trainer = self.trainer
        strategy = trainer.strategy
        before_step = hooks["on_before_optimizer_step"]
        for optimizer in trainer.optimizers:
            for hook in before_step:
                hook(optimizer)
            if trainer.gradient_clip_val is not None:
                strategy.clip_gradients(optimizer, trainer.gradient_clip_val, trainer.gradient_clip_algorithm)
            hooks.steps.optimizer_step(optimizer)

    def _log_step_metrics(self) -> None:
        trainer = self.trainer
        step = self.progress.batches_that_stepped
        if (step + 1) % trainer.log_every_n_steps == 0 or trainer.should_stop or trainer.fast_dev_run:
            values = self.metrics.pop_step_log()
            if values:
                send_to_loggers(trainer, values, step)

    def _end_epoch(self, hooks: Hooks, ended_by_hook: bool = False) -> None:
        """Epoch-level metrics, the epoch-end hooks (checkpoints save here), then the plateau
        epoch schedulers when the epoch reached its last batch (``ended_by_hook``:
        ``on_train_batch_start`` returned -1, which counts as that; [Note: when schedulers step]).

        [Note: epochs cut short]
        An epoch that ends early (``max_steps``, a stop request, ``on_train_batch_start`` returning
        -1) still ends as in Lightning: its epoch-end hooks run and ``current_epoch`` moves on. A
        checkpoint written then or afterwards still records the position inside an epoch cut by
        ``max_steps`` or a stop request (the batches and the samples consumed), so
        ``fit(ckpt_path=...)`` with a larger ``max_steps`` continues exactly where training
        stopped, on any number of processes; its top-level ``"epoch"`` is still ``current_epoch``,
        as Lightning writes it. An epoch the module ended (-1) is finished: nothing of it is left
        to run, an uninterrupted run would go on with the next epoch, and so does a resumed one.
        """
        trainer, progress, metrics = self.trainer, self.progress, self.metrics
        self.nonfinite.settle(trainer)  # [Note: reading the loss without waiting] in nonfinite.py
        cut_short = (
            not ended_by_hook  # the module ended it: an uninterrupted run goes on with the next one
            and not math.isinf(self.num_training_batches)
            and progress.batches_in_epoch < self.num_training_batches
        )
        progress.resume_point = (
            (
                progress.epoch,
                progress.batches_in_epoch,
                resume.samples_in_epoch(self.progress, self.train_loader),
            )
            if cut_short
            else None
        )
        progress.epoch_finished = not cut_short
        metrics.stage = "train"
        metrics.in_step = False
        metrics.reduce_epoch("train")
        hooks.call("on_train_epoch_end")
        metrics.commit()
        # as Lightning: the epoch schedulers step before the epoch's row goes to the loggers (a
        # plateau scheduler missing its metric raises with nothing sent), when the epoch reached
        # its last batch or the module ended it ([Note: when schedulers step]); the row goes at the
        # step before the next one (-1 when none was taken)
        reached_end = trainer.is_last_batch if math.isinf(self.num_training_batches) else not cut_short
        if (reached_end or ended_by_hook) and not self.optimization.manual:
            self.schedulers.step("epoch", plateau=True)
        values = metrics.pop_epoch_log()
        if values:
            send_to_loggers(trainer, values, progress.batches_that_stepped - 1)
        metrics.in_step = True
        progress.start_next_epoch()
        if math.isinf(self.num_training_batches):
            trainer.is_last_batch = False
