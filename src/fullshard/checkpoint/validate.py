"""Checks that a checkpoint fits the model it is loaded into, before anything is changed."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from fullshard.errors import CheckpointError, CorruptCheckpointError

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


# [Note: optimizer states checked against the parameters]
# An optimizer state of another shape than its parameter (an ``exp_avg`` of 1,000,000 elements for
# an 8x4 weight) loads, and fails inside torch at the first step, or, where it broadcasts, trains
# on with garbage. torch.optim's own optimizers keep per parameter tensors of the parameter's
# shape, scalars (the step count) and, for Adafactor's factored moments, the parameter's shape with
# one dimension 1; so for them every tensor of the checkpoint's optimizer states is compared with
# the model's full parameter shapes before anything is loaded (the full format reads the tensors,
# the sharded one DCP's index, which records every tensor's full shape). LBFGS keeps flat vectors
# of all its parameters under the first one, and other optimizers (8-bit, low-rank projections)
# keep what they choose: those are left to the optimizer.
_SCALARS = frozenset({"step", "mu_product", "eta", "mu"})  # Adam's step count, NAdam's, ASGD's
_FACTORED = frozenset({"row_var", "col_var"})  # Adafactor's


def _checked(optimizer: Any) -> bool:
    cls = type(optimizer)
    module = cls.__module__  # "torch.optim.adamw"; "torch.optim" for Adafactor
    return (module == "torch.optim" or module.startswith("torch.optim.")) and cls is not torch.optim.LBFGS


def _fits(key: str, shape: tuple[int, ...], parameter: tuple[int, ...]) -> bool:
    if key in _SCALARS:
        return shape == ()
    if key in _FACTORED:
        return len(shape) == len(parameter) and all(
            s in (p, 1) for s, p in zip(shape, parameter, strict=True)
        )
    return shape == parameter


def check_optimizer_shapes(
    path: str,
    expected: Mapping[str, torch.Size],
    optimizers: Sequence[Any],
    states: Iterable[tuple[int, str, str, tuple[int, ...]]],
) -> None:
    """Raise :class:`~fullshard.errors.CorruptCheckpointError` naming the first tensors of the
    checkpoint's optimizer states (``(optimizer index, parameter name, state key, shape)``) that
    cannot be ``optimizers``' state of the parameters of full shapes ``expected`` (see [Note:
    optimizer states checked against the parameters])."""
    wrong = [
        f"{name}'s {key!r} of optimizer {i} ({type(optimizers[i]).__name__}) has shape {shape}, the parameter "
        f"{tuple(expected[name])}"
        for i, name, key, shape in states
        if i < len(optimizers) and _checked(optimizers[i]) and name in expected
        if not _fits(key, shape, tuple(expected[name]))
    ]
    if wrong:
        raise CorruptCheckpointError(
            f"The checkpoint {path!r} is damaged or was edited: its optimizer state does not fit the parameters "
            f"its model state has: {_listed(wrong)}. Nothing was loaded. Resume from an earlier checkpoint, or "
            f"load only the weights and start the optimizer afresh: fit(..., ckpt_path={path!r}, "
            "ckpt_weights_only=True)."
        )


def full_optimizer_tensors(
    path: str, saved: Any, count: int
) -> Iterator[tuple[int, str, str, tuple[int, ...]]]:
    """``(optimizer index, parameter name, state key, shape)`` of each tensor in the first
    ``count`` optimizer states of a full checkpoint (parameters named, fullshard's layout); the
    states' structure is checked on the way."""
    if not isinstance(saved, list | tuple):
        raise CorruptCheckpointError(
            f"The checkpoint {path!r} is damaged or was edited: its 'optimizer_states' is a "
            f"{type(saved).__name__}, not a list of optimizer.state_dict()s. Resume from an earlier checkpoint."
        )
    for i, state in enumerate(saved[:count]):
        per_parameter = state.get("state") if isinstance(state, Mapping) else None
        if not isinstance(per_parameter, Mapping) or not all(
            isinstance(v, Mapping) for v in per_parameter.values()
        ):
            raise CorruptCheckpointError(
                f"The checkpoint {path!r} is damaged or was edited: its optimizer_states[{i}] is not an "
                "optimizer.state_dict() ({'state': {parameter: {name: value}}, 'param_groups': [...]}). Resume "
                "from an earlier checkpoint."
            )
        for name, entries in per_parameter.items():
            for key, value in entries.items():
                if isinstance(value, torch.Tensor):
                    yield i, str(name), str(key), tuple(value.shape)


def sharded_optimizer_tensors(
    shapes: Mapping[str, torch.Size],
) -> Iterator[tuple[int, str, str, tuple[int, ...]]]:
    """The same, from the full shapes DCP's index records for a sharded checkpoint's tensors
    (``optimizers.<index>.<parameter name>.<state key>``)."""
    for key, shape in shapes.items():
        head, _, rest = key.partition(".")
        index, _, entry = rest.partition(".")
        name, _, state_key = entry.rpartition(".")
        if head == "optimizers" and index.isdigit() and name:
            yield int(index), name, state_key, tuple(shape)
