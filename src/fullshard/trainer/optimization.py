"""The optimization step of ``fit`` beyond the lean path: manual optimization, and the
optimization-loop hooks of automatic optimization, as Lightning 2.x calls them.

[Note: three ways through a training batch]
The fit loop decides once per ``fit`` (:meth:`Optimization.setup`) which way its batches go:

* the lean path (in fit_loop.py) when the module uses automatic optimization and overrides none
  of ``optimizer_step``, ``optimizer_zero_grad``, ``backward``, ``configure_gradient_clipping``:
  no closure, no wrapper, nothing per step that an unused feature would cost;
* :meth:`Optimization.automatic_batch` when it overrides one of them: the training step,
  ``zero_grad`` and ``backward`` run in a closure that ``optimizer.step(closure=...)`` calls,
  inside ``optimizer_step`` when the module overrides that (Lightning's order: the hook is called
  first, the closure runs ``training_step`` inside it);
* :meth:`Optimization.manual_batch` when ``automatic_optimization`` is False: the loop calls
  ``training_step`` and nothing else; the module steps the :class:`LightningOptimizer` wrappers
  that ``self.optimizers()`` returns, and each such step counts as one ``global_step``.

``lr_scheduler_step`` is independent of the three: when overridden, every scheduler stepping the
Trainer does goes through it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.optim import Optimizer

from fullshard.errors import MisconfigurationError
from fullshard.module import Module
from fullshard.trainer.preflight import overrides

if TYPE_CHECKING:
    from fullshard.strategies.strategy import Strategy
    from fullshard.trainer.hooks import Hooks, StrategySteps
    from fullshard.trainer.loops.progress import Progress
    from fullshard.trainer.nonfinite import NonFiniteLoss
    from fullshard.trainer.trainer import Trainer

CLIP_ALGORITHMS = ("norm", "value")
_STEP_HOOKS = ("optimizer_step", "optimizer_zero_grad", "backward", "configure_gradient_clipping")


def _do_nothing() -> None:
    return None


class LightningOptimizer:
    """An optimizer as ``self.optimizers()`` returns it (Lightning's ``LightningOptimizer``).

    ``step(closure=None, **kwargs)`` goes through the Trainer: the closure (if any) runs first,
    then ``on_before_optimizer_step``, then the strategy's step (the grad scaler's, under
    "16-mixed"). Under manual optimization each ``step()`` counts as one ``global_step``. Every
    other attribute (``param_groups``, ``state``, ``defaults``, ...) is the wrapped optimizer's;
    ``isinstance(wrapper, type(optimizer))`` holds, as in Lightning.
    """

    def __init__(self, optimizer: Optimizer, optimization: Optimization) -> None:
        self._optimizer = optimizer
        self._optimization = optimization
        # a class of its own that also derives from the optimizer's class, as Lightning does, so
        # that isinstance checks against the optimizer's type keep working on the wrapper
        self.__class__ = type(
            f"Lightning{type(optimizer).__name__}", (LightningOptimizer, type(optimizer)), {}
        )

    @property
    def optimizer(self) -> Optimizer:
        """The wrapped ``torch.optim.Optimizer``."""
        return self._optimizer

    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        """Step the optimizer through the Trainer; returns what ``closure`` returned.

        Raises:
            MisconfigurationError: ``closure`` is given but is not callable.
        """
        if closure is not None and not callable(closure):
            raise MisconfigurationError(
                f"optimizer.step(closure=...) got a {type(closure).__name__}, which is not callable. Pass a "
                "function (it runs before the step, e.g. computing the loss and calling manual_backward), or "
                "no closure."
            )
        return self._optimization.optimizer_step(self._optimizer, closure, **kwargs)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero (by default: set to None) the gradients of the wrapped optimizer's parameters."""
        self._optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's ``state_dict()``."""
        return self._optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load into the wrapped optimizer."""
        self._optimizer.load_state_dict(state_dict)

    @contextlib.contextmanager
    def toggle_model(self, sync_grad: bool = True) -> Iterator[None]:
        """Inside the context only this optimizer's parameters require gradients
        (``toggle_optimizer``); with ``sync_grad=False`` backward passes also skip the gradient
        synchronisation between processes (accumulate locally, sync on a later backward)."""
        optimization = self._optimization
        module = optimization.trainer.lightning_module
        with optimization.trainer.strategy.no_backward_sync(enabled=not sync_grad):
            module.toggle_optimizer(self)
            try:
                yield
            finally:
                module.untoggle_optimizer(self)

    def __getattr__(self, name: str) -> Any:
        # only called for what the wrapper itself lacks: param_groups, state, defaults, ...
        if name in ("_optimizer", "_optimization"):
            raise AttributeError(name)
        return getattr(self._optimizer, name)

    def __repr__(self) -> str:
        return f"LightningOptimizer({self._optimizer!r})"


class _Closure:
    """The training step, ``zero_grad`` and ``backward`` of one batch, run once when called
    (``optimizer_step``'s ``optimizer_closure``); returns the loss (None: training_step returned None)."""

    def __init__(self, run: Callable[[], torch.Tensor | None]) -> None:
        self._run = run
        self.ran = False
        self.loss: torch.Tensor | None = None

    def __call__(self) -> torch.Tensor | None:
        if not self.ran:
            self.ran = True
            self.loss = self._run()
        return self.loss


class Optimization:
    """The optimization of ``fit``'s batches other than the lean path (see [Note: three ways
    through a training batch]). Owned by the fit loop; the wrappers it makes are what
    ``Module.optimizers()`` returns."""

    def __init__(self, trainer: Trainer, progress: Progress) -> None:
        self.trainer = trainer
        self.progress = progress
        self.manual = False
        self.uses_hooks = False  # automatic optimization with a step hook overridden
        self._module: Module | None = None
        self._hooks: Hooks | None = None
        self._nonfinite: NonFiniteLoss | None = None
        self._wrapped: dict[int, LightningOptimizer] = {}
        self._step_hook = False
        self._zero_grad_hook = False
        self._backward_hook = False
        self._clip_hook = False
        self.scheduler_hook: Callable[[Any, Any], None] | None = None
        # set while an automatic batch runs: whether its step is skipped (a non-finite loss), its batch index
        self._skip_step = False
        self._batch_idx = 0

    # --------------------------------------------------------------------------- set up
    def setup(self, module: Module, hooks: Hooks, nonfinite: NonFiniteLoss) -> None:
        """Decide, once per ``fit``, which way batches go and which hooks are called."""
        self._module, self._hooks, self._nonfinite = module, hooks, nonfinite
        self.manual = not module.automatic_optimization
        self._step_hook, self._zero_grad_hook, self._backward_hook, self._clip_hook = (
            overrides(module, Module, name) for name in _STEP_HOOKS
        )
        self.uses_hooks = not self.manual and any(
            (self._step_hook, self._zero_grad_hook, self._backward_hook, self._clip_hook)
        )
        self.scheduler_hook = (
            module.lr_scheduler_step if overrides(module, Module, "lr_scheduler_step") else None
        )
        self.trainer.strategy.set_manual_optimization(self.manual)
        self._wrapped = {}

    def wrapped(self, optimizers: list[Optimizer]) -> list[LightningOptimizer]:
        """The :class:`LightningOptimizer` of each of ``optimizers`` (made once per optimizer)."""
        out = []
        for optimizer in optimizers:
            wrapper = self._wrapped.get(id(optimizer))
            if wrapper is None or wrapper.optimizer is not optimizer:
                wrapper = self._wrapped[id(optimizer)] = LightningOptimizer(optimizer, self)
            out.append(wrapper)
        return out

    def _require_module(self) -> Module:
        if self._module is None:
            self._module = self.trainer.lightning_module
        return self._module

    def _steps(self) -> StrategySteps | Strategy:
        """The strategy's steps through the Trainer's dispatch ([Note: profiling at the dispatch]
        in fullshard.trainer.hooks); the strategy itself before a call set the hooks up."""
        return self._hooks.steps if self._hooks is not None else self.trainer.strategy

    # ------------------------------------------------------------------ shared pieces
    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """``on_before_backward``, the backward (the module's ``backward`` hook, when it
        overrides it, gets the scaled loss), ``on_after_backward``; as ``manual_backward`` and
        the automatic closure do it."""
        hooks = self._hooks
        if hooks is not None:
            hooks.call("on_before_backward", loss)
        module_backward = self._require_module().backward if self._backward_hook else None
        self._steps().backward(loss, *args, backward=module_backward, **kwargs)
        if hooks is not None:
            hooks.call("on_after_backward")

    def clipping(self, clip_val: Any, algorithm: str | None) -> tuple[float, str]:
        """The value and algorithm ``Module.clip_gradients`` clips with: the given ones, else the
        Trainer's (no clipping when it has none), as Lightning resolves them.

        Raises:
            MisconfigurationError: the Trainer clips with another value or algorithm, or the
                algorithm is unknown.
            TypeError: ``clip_val`` is not a number.
        """
        trainer = self.trainer
        configured = trainer.gradient_clip_val is not None
        if clip_val is None:
            clip_val = trainer.gradient_clip_val or 0.0
        elif configured and trainer.gradient_clip_val != clip_val:
            raise MisconfigurationError(
                f"Trainer(gradient_clip_val={trainer.gradient_clip_val!r}) and clip_gradients(gradient_clip_val="
                f"{clip_val!r}) disagree. Use only one of them."
            )
        if algorithm is None:
            algorithm = trainer.gradient_clip_algorithm or "norm"
        else:
            algorithm = algorithm.lower()
            if configured and trainer.gradient_clip_algorithm != algorithm:
                raise MisconfigurationError(
                    f"Trainer(gradient_clip_algorithm={trainer.gradient_clip_algorithm!r}) and clip_gradients("
                    f"gradient_clip_algorithm={algorithm!r}) disagree. Use only one of them."
                )
        if isinstance(clip_val, bool) or not isinstance(clip_val, int | float):
            raise TypeError(f"gradient_clip_val must be an int or a float, got {clip_val!r}.")
        if algorithm not in CLIP_ALGORITHMS:
            raise MisconfigurationError(
                f"gradient_clip_algorithm={algorithm!r} is invalid: use 'norm' or 'value'."
            )
        return float(clip_val), algorithm

    def clip_gradients(self, optimizer: Optimizer, clip_val: float, algorithm: str) -> None:
        """Clip ``optimizer``'s gradients through the strategy (the norm over all shards under FSDP)."""
        if clip_val > 0:
            self.trainer.strategy.clip_gradients(optimizer, clip_val, algorithm)

    def optimizer_step(self, optimizer: Optimizer, closure: Callable[[], Any] | None, **kwargs: Any) -> Any:
        """What :meth:`LightningOptimizer.step` does: the closure, ``on_before_optimizer_step``,
        clipping (automatic optimization), the strategy's step; a manual step counts as a
        ``global_step``."""
        result = (closure or _do_nothing)()
        if not self.manual and self._skip_step:
            return result  # a non-finite loss under on_nonfinite_loss="skip": no step, as on the lean path
        hooks = self._hooks
        if hooks is not None:
            hooks.call("on_before_optimizer_step", optimizer)
        trainer = self.trainer
        if not self.manual:
            if self._clip_hook:
                self._require_module().configure_gradient_clipping(
                    optimizer,
                    gradient_clip_val=trainer.gradient_clip_val,
                    gradient_clip_algorithm=trainer.gradient_clip_algorithm,
                )
            elif trainer.gradient_clip_val is not None:
                self.clip_gradients(optimizer, trainer.gradient_clip_val, trainer.gradient_clip_algorithm)
        self._steps().optimizer_step(optimizer, **kwargs)
        if self.manual:
            self.progress.global_step += 1
        return result

    # ---------------------------------------------------------------- automatic batches
    def automatic_batch(
        self, batch: Any, batch_idx: int, boundary: bool, run_step: Callable[[], Any]
    ) -> tuple[Any, torch.Tensor | None, bool]:
        """One batch of automatic optimization with the step hooks: returns the training step's
        output, its (normalised) loss and whether the optimizer step was taken.

        ``run_step`` runs ``training_step`` and checks its output (the fit loop's, so that a
        skipped batch is agreed on as on the lean path); it returns (output, loss).
        """
        trainer = self.trainer
        module = self._require_module()
        accumulate = trainer.accumulate_grad_batches
        optimizers = trainer.optimizers
        hooks = self._hooks
        assert hooks is not None and self._nonfinite is not None
        nonfinite = self._nonfinite
        result: list[Any] = [None]

        def closure_body() -> torch.Tensor | None:
            # a None loss still zeroes the gradients and steps: [Note: a training step that
            # returns None] in step_output.py
            output, loss = run_step()
            result[0] = output
            if loss is not None:
                nonfinite.observe(loss, batch_idx)
            if batch_idx % accumulate == 0:
                for optimizer in optimizers:
                    hooks.call("on_before_zero_grad", optimizer)
                    if self._zero_grad_hook:
                        module.optimizer_zero_grad(trainer.current_epoch, batch_idx, optimizer)
                    else:
                        optimizer.zero_grad(set_to_none=True)
            scaled = None
            if loss is not None:
                scaled = loss / accumulate if accumulate > 1 else loss
                self.backward(scaled)
            if boundary:
                self._skip_step = not nonfinite.step_allowed(trainer)
            return scaled

        closure = _Closure(closure_body)
        self._skip_step = False
        if not boundary:
            with trainer.strategy.no_backward_sync(enabled=True):
                closure()
            return result[0], closure.loss, False
        for index, wrapper in enumerate(self.wrapped(optimizers)):
            # the first optimizer's step runs the batch; further ones (fullshard, unlike
            # Lightning, steps several optimizers in automatic optimization) get its loss
            step_closure: Callable[[], Any] = closure if index == 0 else (lambda: closure.loss)
            if self._step_hook:
                module.optimizer_step(trainer.current_epoch, batch_idx, wrapper, step_closure)
            else:
                wrapper.step(closure=step_closure)
            if not closure.ran:
                raise MisconfigurationError(
                    f"{type(module).__name__}.optimizer_step() did not run the optimizer closure, which calls "
                    "training_step, zero_grad and backward. Call optimizer.step(closure=optimizer_closure) (or "
                    "optimizer_closure()) in it."
                )
        return result[0], closure.loss, not self._skip_step

    # ------------------------------------------------------------------- manual batches
    def manual_batch(self, batch: Any, batch_idx: int) -> Any:
        """One batch of manual optimization: ``training_step`` and nothing else. Returns what
        ``on_train_batch_end`` receives: the output as a dict, its ``"loss"`` detached (Lightning's)."""
        output = self._steps().training_step(batch, batch_idx)
        if output is None:
            return {}
        if isinstance(output, torch.Tensor):
            return {"loss": output.detach()}
        if isinstance(output, dict):
            outputs = dict(output)
            if isinstance(outputs.get("loss"), torch.Tensor):
                outputs["loss"] = outputs["loss"].detach()
            return outputs
        raise MisconfigurationError(
            f"training_step returned {type(output).__name__}; under manual optimization it must return a "
            "tensor, a dict, or None."
        )
