"""Checks that a checkpoint fits the model it is loaded into, before anything is changed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from fullshard.errors import CheckpointError

_MAX_LISTED = 10


def _listed(keys: list[str]) -> str:
    shown = ", ".join(keys[:_MAX_LISTED])
    return shown + (f" (+{len(keys) - _MAX_LISTED} more)" if len(keys) > _MAX_LISTED else "")


class StateDictMismatchError(CheckpointError):
    """A checkpoint's model state does not fit the model: keys missing, unexpected, or shaped differently."""

    def __reduce__(self) -> tuple[Any, ...]:  # rebuilt on other ranks after a broadcast
        return (type(self), (self.missing, self.unexpected, self.mismatched))

    def __init__(self, missing: list[str], unexpected: list[str], mismatched: list[str]) -> None:
        self.missing, self.unexpected, self.mismatched = missing, unexpected, mismatched
        parts = []
        if missing:
            parts.append(f"missing keys: {_listed(missing)}")
        if unexpected:
            parts.append(f"unexpected keys: {_listed(unexpected)}")
        if mismatched:
            parts.append(f"shape mismatches: {_listed(mismatched)}")
        super().__init__(
            "The checkpoint does not match the model (" + "; ".join(parts) + "). Load a checkpoint "
            "written by this model's architecture, or build the model with the settings the "
            "checkpoint was trained with. Nothing was loaded."
        )


def check_state_dict_matches(
    expected: Mapping[str, torch.Size], state_dict: Mapping[str, Any], strict: bool = True
) -> None:
    """Raise :class:`StateDictMismatchError` unless ``state_dict`` fits a model whose full tensor
    shapes are ``expected`` (recorded before sharding, so no gather is needed to check).

    Shapes are always checked; missing and unexpected keys only when ``strict``.
    """
    mismatched = [
        f"{key} (checkpoint {tuple(value.shape)}, model {tuple(expected[key])})"
        for key, value in state_dict.items()
        if key in expected and isinstance(value, torch.Tensor) and value.shape != expected[key]
    ]
    missing = sorted(set(expected) - set(state_dict)) if strict else []
    unexpected = sorted(set(state_dict) - set(expected)) if strict else []
    if missing or unexpected or mismatched:
        raise StateDictMismatchError(missing, unexpected, mismatched)
