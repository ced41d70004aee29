"""The arguments a step method gets: ``batch_idx`` only where its signature takes one.

Lightning's rule, which fullshard follows: ``training_step`` (and ``validation_step``,
``test_step``, ``predict_step``) gets ``batch_idx`` when its signature names it, has ``*args``, or
has at least two positional parameters after ``self`` (whatever their names); otherwise it is
called with the batch alone (and ``dataloader_idx`` when there are several dataloaders), so
``def training_step(self, batch)`` works as it does in Lightning.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any


@functools.cache
def _takes_batch_idx(function: Any) -> bool:
    function = getattr(function, "__wrapped__", function)  # a decorated step: its own signature
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):  # no signature to read: pass everything, as before
        return True
    if parameters and parameters[0].name == "self" and not inspect.ismethod(function):
        parameters = parameters[1:]
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return (
        any(p.name == "batch_idx" for p in parameters)
        or any(p.kind is p.VAR_POSITIONAL for p in parameters)
        or len(positional) >= 2
    )


def step_arguments(
    module: Any, method: str, batch: Any, batch_idx: int, extra: tuple[Any, ...]
) -> tuple[Any, ...]:
    """``(batch, batch_idx, *extra)``, without ``batch_idx`` when ``module.<method>`` takes none."""
    # the class's method: what the user wrote (FSDP2 sets a wrapper taking *args on the instance)
    function = getattr(type(module), method, None) or getattr(module, method)
    return (batch, batch_idx, *extra) if _takes_batch_idx(function) else (batch, *extra)
