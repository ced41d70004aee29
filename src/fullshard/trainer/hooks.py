"""Which callables each hook name calls, worked out once per ``fit``/``validate``/``test``/``predict``.

The hot path stays lean: a hook that no callback and not the module overrides has an empty
list, so calling it costs a dictionary lookup and nothing per step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from fullshard.module import Module
from fullshard.trainer.callbacks import Callback, EarlyStopping, ModelCheckpoint
from fullshard.trainer.preflight import overrides

if TYPE_CHECKING:
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
        callbacks = list(callbacks)
        for name in HOOK_NAMES:
            overriding = [cb for cb in callbacks if overrides(cb, Callback, name)]
            monitoring = [cb for cb in overriding if name == "on_train_epoch_end" and isinstance(cb, _MONITORS)]
            calls: list[Callable[..., Any]] = [
                functools.partial(getattr(cb, name), trainer, module) for cb in overriding if cb not in monitoring
            ]
            module_hook = self.module_hook(name)
            if module_hook is not None:
                calls.append(module_hook)
            calls += [functools.partial(getattr(cb, name), trainer, module) for cb in monitoring]
            self._calls[name] = calls

    def __getitem__(self, name: str) -> list[Callable[..., Any]]:
        return self._calls.get(name, [])

    def call(self, name: str, *args: Any) -> None:
        """Call hook ``name`` with ``args`` (after the trainer and module, for callbacks)."""
        for function in self._calls.get(name, ()):
            function(*args)

    def module_hook(self, name: str) -> Callable[..., Any] | None:
        """The module's ``name`` hook when it overrides it, else None."""
        if name in _CALLBACK_ONLY or not overrides(self.module, Module, name):
            return None
        return getattr(self.module, name)  # type: ignore[no-any-return]
