"""Which callables each hook name calls, worked out once per ``fit``/``validate``/``test``/``predict``.

The hot path stays lean: a hook that no callback and not the module overrides has an empty
list, so calling it costs a dictionary lookup and nothing per step.

[Note: profiling at the dispatch]
The loops reach the hooks and the strategy's per-batch steps only through this dispatch (the
strategy's through :class:`StrategySteps`), so a profiler (``Trainer(profiler=...)``) times them
here: each callable is wrapped once per call under Lightning's action names
(``[Callback]<state_key>.<hook>``, ``[LightningModule]<class>.<hook>``,
``[Strategy]<class>.<step>``), as Lightning's ``_call_strategy_hook`` times at its dispatch.
Without a profiler the callables are the bound methods themselves: no cost per step. Nothing is
replaced on the strategy or the loops.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from fullshard.batch_transfer import BATCH_TRANSFER_HOOKS, BatchTransfer
from fullshard.datamodule import DataModule
from fullshard.module import Module
from fullshard.profilers.base import PassThroughProfiler, Profiler
from fullshard.trainer.callbacks.base import Callback
from fullshard.trainer.callbacks.early_stopping import EarlyStopping
from fullshard.trainer.callbacks.model_checkpoint import ModelCheckpoint
from fullshard.trainer.preflight import overrides

if TYPE_CHECKING:
    from fullshard.strategies.strategy import Strategy
    from fullshard.trainer.trainer import Trainer

HOOK_NAMES = [name for name in vars(Callback) if name.startswith("on_") or name in ("setup", "teardown")]
_CALLBACK_ONLY = frozenset({"on_sanity_check_start", "on_sanity_check_end", "on_exception"})
# Callbacks that act on metrics an epoch-end hook of the module may log: called after it.
_MONITORS = (ModelCheckpoint, EarlyStopping)


class Hooks:
    """For every hook, the callables to call in order: the callbacks that override it, then the
    module if it does; checkpointing and early stopping come after the module in
    ``on_train_epoch_end`` so that they see what it logged (Lightning's order)."""

    def __init__(self, trainer: Trainer, callbacks: Iterable[Callback], module: Module) -> None:
        self.module = module
        self._calls: dict[str, list[Callable[..., Any]]] = {}
        profiler = trainer.profiler
        wrap = profiler.wrap
        self._wrap = wrap
        self._module_hooks: dict[str, Callable[..., Any] | None] = {}
        callbacks = list(callbacks)

        def callback_call(cb: Callback, name: str) -> Callable[..., Any]:
            return wrap(
                f"[Callback]{cb.state_key}.{name}", functools.partial(getattr(cb, name), trainer, module)
            )

        for name in HOOK_NAMES:
            overriding = [cb for cb in callbacks if overrides(cb, Callback, name)]
            monitoring = [
                cb for cb in overriding if name == "on_train_epoch_end" and isinstance(cb, _MONITORS)
            ]
            calls: list[Callable[..., Any]] = [
                callback_call(cb, name) for cb in overriding if cb not in monitoring
            ]
            module_hook = self.module_hook(name)
            if module_hook is not None:
                calls.append(module_hook)
            calls += [callback_call(cb, name) for cb in monitoring]
            self._calls[name] = calls
        transfer = resolve_batch_transfer(module, trainer.datamodule, wrap)
        self.steps = StrategySteps(trainer.strategy, transfer, profiler)

    def __getitem__(self, name: str) -> list[Callable[..., Any]]:
        return self._calls.get(name, [])

    def call(self, name: str, *args: Any) -> None:
        """Call hook ``name`` with ``args`` (after the trainer and module, for callbacks)."""
        for function in self._calls.get(name, ()):
            function(*args)

    def module_hook(self, name: str) -> Callable[..., Any] | None:
        """The module's ``name`` hook when it overrides it, else None (the same object each time:
        the loops compare it with the entries of ``hooks[name]``)."""
        if name not in self._module_hooks:
            found = None
            if name not in _CALLBACK_ONLY and overrides(self.module, Module, name):
                found = self._wrap(
                    f"[LightningModule]{type(self.module).__name__}.{name}", getattr(self.module, name)
                )
            self._module_hooks[name] = found
        return self._module_hooks[name]


class StrategySteps:
    """The strategy's per-batch calls as the loops make them: its bound methods, or each timed
    by the profiler ([Note: profiling at the dispatch]); ``batch_to_device`` is given the
    batch-transfer hooks of the call (an argument, not state the strategy keeps)."""

    def __init__(self, strategy: Strategy, transfer: BatchTransfer | None, profiler: Profiler) -> None:
        self.batch_to_device: Callable[..., Any] = functools.partial(
            strategy.batch_to_device, transfer=transfer
        )
        self.training_step: Callable[..., Any] = strategy.training_step
        self.backward: Callable[..., Any] = strategy.backward
        self.optimizer_step: Callable[..., Any] = strategy.optimizer_step
        self.evaluation_step: Callable[..., Any] = strategy.evaluation_step
        if isinstance(profiler, PassThroughProfiler):
            return
        kind, wrap = type(strategy).__name__, profiler.wrap
        self.batch_to_device = wrap(f"[Strategy]{kind}.batch_to_device", self.batch_to_device)
        self.training_step = wrap(f"[Strategy]{kind}.training_step", self.training_step)
        self.backward = wrap(f"[Strategy]{kind}.backward", self.backward)
        self.optimizer_step = wrap(f"[Strategy]{kind}.optimizer_step", self.optimizer_step)
        evaluation_step = self.evaluation_step

        def profiled_evaluation_step(method: str, batch: Any, batch_idx: int, *extra: Any) -> Any:
            with profiler.profile(f"[Strategy]{kind}.{method}"):  # extra: dataloader_idx with several loaders
                return evaluation_step(method, batch, batch_idx, *extra)

        self.evaluation_step = profiled_evaluation_step


def _unwrapped(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    return function


def resolve_batch_transfer(
    module: Module,
    datamodule: DataModule | None,
    wrap: Callable[[str, Callable[..., Any]], Callable[..., Any]] = _unwrapped,
) -> BatchTransfer | None:
    """The batch-transfer hooks ``Strategy.batch_to_device`` runs, or None when neither the
    module nor the DataModule overrides one (the strategy then moves the batch itself). Each hook
    is the DataModule's when it overrides it, else the module's (Lightning's rule, with its
    warnings, once per process as Lightning gives them, when the module overrides one and a
    DataModule is given: given as the first batch moves, see :class:`BatchTransfer`)."""
    chosen: list[Callable[..., Any]] = []
    notes: list[str] = []
    overridden = False
    for name in BATCH_TRANSFER_HOOKS:
        in_data = datamodule is not None and overrides(datamodule, DataModule, name)
        in_module = overrides(module, Module, name)
        if in_data and in_module:
            notes.append(
                f"You have overridden `{name}` in both the Module and the DataModule: the DataModule's "
                "is used (as in Lightning). Remove one of them to silence this warning."
            )
        elif datamodule is not None and in_module:
            notes.append(
                f"You have overridden `{name}` in the LightningModule, and the LightningDataModule passed "
                "does not override it: the module's is used."
            )
        owner: Any = datamodule if in_data else module
        kind = "LightningDataModule" if in_data else "LightningModule"
        chosen.append(wrap(f"[{kind}]{type(owner).__name__}.{name}", getattr(owner, name)))
        overridden = overridden or in_data or in_module
    if not overridden:
        return None
    before, transfer, after = chosen
    return BatchTransfer(before, transfer, after, notes=tuple(notes))


def start_fit(trainer: Trainer, hooks: Hooks) -> None:
    """The start of ``fit``: the ``on_fit_start`` hooks (the ModelSummary callback prints the
    summary there). Resuming, it runs between the callbacks' states and the optimizers'
    (``CheckpointManager.load``), as in Lightning."""
    trainer.should_stop = False
    hooks.call("on_fit_start")
