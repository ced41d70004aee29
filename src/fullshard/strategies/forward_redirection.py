"""Running a step method through a wrapper's ``__call__``, so DDP and FSDP do their work around it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn


def redirected_call(
    wrapper: nn.Module,
    module: nn.Module,
    method: str,
    *args: Any,
    after_step: Callable[[], None] | None = None,
) -> Any:
    """Call ``module.<method>(*args)`` through ``wrapper.__call__`` (``after_step``: called when
    the step method returned, before the wrapper's post-forward work).

    [Note: forward redirection]
    DDP and FSDP do their work (gradient-sync bookkeeping, all-gathers, resharding) around the
    ``forward`` of the module they wrap, but the Trainer calls ``training_step``. So for one call
    the wrapped module's ``forward`` is pointed at the step method, and the wrapper is called. The
    original ``forward`` is put back before the step runs, so ``self(x)`` inside the step is the
    user's forward. Wrapping the user's module directly (rather than a helper module around it)
    keeps every state-dict key free of wrapper prefixes.
    """
    step = getattr(module, method)
    had_instance_forward = "forward" in module.__dict__
    original_forward = module.__dict__.get("forward")

    def restore() -> None:
        if had_instance_forward:
            module.forward = original_forward  # type: ignore[method-assign,assignment]
        else:
            module.__dict__.pop("forward", None)

    def forward(*step_args: Any) -> Any:
        restore()
        out = step(*step_args)
        if after_step is not None:
            after_step()
        return out

    module.forward = forward  # type: ignore[method-assign]
    try:
        return wrapper(*args)
    finally:
        restore()
