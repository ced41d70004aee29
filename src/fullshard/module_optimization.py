"""The optimization side of :class:`fullshard.Module`: the optimization-loop hooks of automatic
optimization and the methods of manual optimization (Lightning's names and arguments). The work
is done by the fit loop's :class:`~fullshard.trainer.optimization.Optimization`; see [Note:
three ways through a training batch] there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.optim import Optimizer

from fullshard.errors import MisconfigurationError

if TYPE_CHECKING:
    from fullshard.trainer.trainer import Trainer

    _ModuleBase = nn.Module
else:
    _ModuleBase = object


def extract_loss(output: Any) -> torch.Tensor | None:
    """The loss of a ``training_step`` result under automatic optimization: a tensor,
    ``{"loss": tensor}``, or None (no loss). The fit loop and the memory planner take it so.

    Raises:
        MisconfigurationError: ``output`` is none of these.
    """
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


class OptimizationHooks(_ModuleBase):
    """Optimizers, schedulers, backward and clipping, in automatic and manual optimization."""

    if TYPE_CHECKING:
        trainer: Trainer
        automatic_optimization: bool
        _param_requires_grad_state: dict[nn.Parameter, bool]

    # The Trainer calls these only when the module overrides them (decided once per fit: see
    # [Note: three ways through a training batch] in fullshard.trainer.optimization).
    def optimizer_step(
        self,
        epoch: int,
        batch_idx: int,
        optimizer: Any,
        optimizer_closure: Callable[[], Any] | None = None,
    ) -> None:
        """Step ``optimizer`` (a :class:`~fullshard.trainer.optimization.LightningOptimizer`) at the
        end of each accumulation window (automatic optimization).

        ``optimizer_closure`` runs ``training_step``, ``zero_grad`` (when due) and backward: it
        must be run, typically by ``optimizer.step(closure=optimizer_closure)``. Override to act
        around the step, e.g. a learning-rate warm-up that sets ``param_groups[i]["lr"]`` first.
        """
        optimizer.step(closure=optimizer_closure)

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Optimizer) -> None:
        """Zero the gradients of ``optimizer`` (first micro-batch of each accumulation window,
        after ``on_before_zero_grad``). Default: ``optimizer.zero_grad()`` (set to None)."""
        optimizer.zero_grad()

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Backpropagate ``loss`` (already divided by ``accumulate_grad_batches``, and scaled
        under "16-mixed"). Default: ``loss.backward(*args, **kwargs)``."""
        loss.backward(*args, **kwargs)

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        """Step ``scheduler`` when its interval and frequency say so; ``metric`` is the monitored
        value for a ``ReduceLROnPlateau`` (or ``"reduce_on_plateau": True``) scheduler, else None.
        Override it for schedulers without torch's API (``timm``'s take the epoch or step)."""
        if metric is None:
            scheduler.step()
        else:
            scheduler.step(metric)

    def configure_gradient_clipping(
        self,
        optimizer: Optimizer,
        gradient_clip_val: int | float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clip the gradients before each optimizer step (automatic optimization), with the
        Trainer's ``gradient_clip_val`` / ``gradient_clip_algorithm``. Default:
        :meth:`clip_gradients` with them."""
        self.clip_gradients(
            optimizer, gradient_clip_val=gradient_clip_val, gradient_clip_algorithm=gradient_clip_algorithm
        )

    def optimizers(self, use_pl_optimizer: bool = True) -> Any:
        """The optimizer(s) the Trainer built from :meth:`configure_optimizers` (one, or a list).

        By default each is wrapped in a :class:`~fullshard.trainer.optimization.LightningOptimizer`,
        whose ``step()`` goes through the Trainer (precision, ``on_before_optimizer_step``, the
        ``global_step`` count of manual optimization); ``use_pl_optimizer=False``: the raw ones.
        """
        optimizers: list[Any] = self.trainer.optimizers
        if use_pl_optimizer:
            optimizers = self.trainer.fit_loop.optimization.wrapped(optimizers)
        return optimizers[0] if len(optimizers) == 1 else optimizers

    def lr_schedulers(self) -> Any:
        """The LR scheduler(s) from :meth:`configure_optimizers` (None, one, or a list)."""
        schedulers = [config.scheduler for config in self.trainer.lr_scheduler_configs]
        if not schedulers:
            return None
        return schedulers[0] if len(schedulers) == 1 else schedulers

    def manual_backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Backpropagate ``loss`` inside ``training_step`` under manual optimization, through the
        strategy: scaled under "16-mixed", gradients reduced (DDP) or reduce-scattered (FSDP),
        except inside ``self.trainer.strategy.no_backward_sync(enabled=True)`` or
        ``opt.toggle_model(sync_grad=False)``. Calls ``on_before_backward`` / ``on_after_backward``.

        Raises:
            MisconfigurationError: the module uses automatic optimization.
        """
        self._require_manual("manual_backward")
        self.trainer.fit_loop.optimization.backward(loss, *args, **kwargs)

    def _require_manual(self, what: str) -> None:
        if self.automatic_optimization:
            raise MisconfigurationError(
                f"{type(self).__name__}.{what}() is for manual optimization, but automatic_optimization is "
                "True. Set self.automatic_optimization = False in __init__, or return the loss from "
                "training_step and let the Trainer run backward."
            )

    def toggle_optimizer(self, optimizer: Any) -> None:
        """Let only ``optimizer``'s parameters require gradients: those of the other optimizers
        get ``requires_grad=False`` until :meth:`untoggle_optimizer` (which restores them)."""
        state: dict[nn.Parameter, bool] = {}
        for opt in self.trainer.optimizers:
            for group in opt.param_groups:
                for param in group["params"]:
                    if param not in state:
                        state[param] = param.requires_grad
                        param.requires_grad = False
        for group in optimizer.param_groups:
            for param in group["params"]:
                param.requires_grad = state[param]
        self._param_requires_grad_state = state

    def untoggle_optimizer(self, optimizer: Any) -> None:
        """Restore the ``requires_grad`` that :meth:`toggle_optimizer` changed."""
        raw = getattr(optimizer, "optimizer", optimizer)
        state = self._param_requires_grad_state
        for opt in self.trainer.optimizers:
            if opt is raw:
                continue
            for group in opt.param_groups:
                for param in group["params"]:
                    if param in state:
                        param.requires_grad = state[param]
        self._param_requires_grad_state = {}

    @contextlib.contextmanager
    def toggled_optimizer(self, optimizer: Any) -> Iterator[None]:
        """:meth:`toggle_optimizer` inside the context, :meth:`untoggle_optimizer` on leaving it."""
        self.toggle_optimizer(optimizer)
        try:
            yield
        finally:
            self.untoggle_optimizer(optimizer)

    def clip_gradients(
        self,
        optimizer: Any,
        gradient_clip_val: int | float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clip ``optimizer``'s gradients through the strategy (unscaled first under "16-mixed";
        the norm over all shards under FSDP). Defaults: the Trainer's ``gradient_clip_val`` (none:
        no clipping) and ``gradient_clip_algorithm``; ``"norm"`` or ``"value"``.

        Raises:
            MisconfigurationError: the Trainer clips with another value or algorithm, or the
                algorithm is unknown.
            TypeError: ``gradient_clip_val`` is not a number.
        """
        optimization = self.trainer.fit_loop.optimization
        value, algorithm = optimization.clipping(gradient_clip_val, gradient_clip_algorithm)
        optimization.clip_gradients(getattr(optimizer, "optimizer", optimizer), value, algorithm)
