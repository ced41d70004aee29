"""``LambdaCallback``: a callback made of plain functions, one per hook."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fullshard.trainer.callbacks.base import Callback

_HOOKS = tuple(name for name in vars(Callback) if name.startswith("on_") or name in ("setup", "teardown"))


class LambdaCallback(Callback):
    """Calls the function given for each hook, with the hook's arguments (the Trainer and the
    module first), as Lightning's ``LambdaCallback``::

        LambdaCallback(on_train_epoch_end=lambda trainer, module: print(trainer.current_epoch))

    Accepts a keyword for every hook of :class:`Callback` (``setup``, ``teardown``,
    ``on_fit_start``, ..., ``on_exception``, ``on_save_checkpoint``, ``on_load_checkpoint``).

    Raises:
        TypeError: for a keyword that names no hook, or a value that is not callable.
    """

    def __init__(self, **hooks: Callable[..., Any] | None) -> None:
        unknown = sorted(set(hooks) - set(_HOOKS))
        if unknown:
            raise TypeError(
                f"LambdaCallback got {', '.join(repr(k) for k in unknown)}, which is not a Callback hook. Accepted: "
                f"{', '.join(_HOOKS)}."
            )
        for name, function in hooks.items():
            if function is None:
                continue
            if not callable(function):
                raise TypeError(
                    f"LambdaCallback({name}=...) must be a function taking the hook's arguments, got "
                    f"{type(function).__name__}."
                )
            setattr(self, name, function)
