"""Tied parameters in checkpoints: which ties a checkpoint's record may be believed for
(:func:`checked_ties`), and which a checkpoint without a record holds (:func:`find_ties`).

[Note: a tie is believed only where the checkpoint agrees]
A checkpoint records ``{alias: canonical}`` under ``tied_parameters`` (see [Note: tied parameters
stored once] in io.py), and readers act on it: a sharded load reads only the canonical tensor and
hands it to the alias, an export writes the canonical tensor alone. Believed blindly, one edited
entry (``{"net.0.weight": "net.2.weight"}``) would load or export one tensor's values under
another's name. So a tie is believed only where the checkpoint's own tensors agree with it: the
record is a mapping of names to names, and where the alias is stored too, it has the canonical
tensor's shape and dtype (and, where both values are at hand, equal values); otherwise the read
raises :class:`~fullshard.errors.CorruptCheckpointError` naming both entries. A tie whose
canonical name the checkpoint does not hold is not believed (nothing to restore from), as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from fullshard.errors import CorruptCheckpointError


def _described(value: Any) -> tuple[tuple[int, ...], torch.dtype | None] | None:
    """The shape and dtype (None: not known) of a stored entry: a tensor, DCP's index entry of
    one (``TensorStorageMetadata``), or a shape alone; None for anything else."""
    if isinstance(value, torch.Tensor):
        return tuple(value.shape), value.dtype
    size = getattr(value, "size", None)
    if isinstance(size, tuple):  # DCP's TensorStorageMetadata (torch.Size is a tuple)
        return tuple(size), getattr(getattr(value, "properties", None), "dtype", None)
    if isinstance(value, tuple) and all(isinstance(n, int) for n in value):
        return tuple(value), None
    return None


def _said(described: tuple[tuple[int, ...], torch.dtype | None]) -> str:
    shape, dtype = described
    return f"{shape}" + (f" {str(dtype).removeprefix('torch.')}" if dtype is not None else "")


def _one_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """One view of one storage (shapes equal already): how ``torch.save`` keeps a tie, equal for free."""
    return a.device == b.device and (a.data_ptr(), a.stride()) == (b.data_ptr(), b.stride())


def checked_ties(recorded: object, stored: Mapping[str, Any], where: str) -> dict[str, str]:
    """The ties of ``recorded`` (a checkpoint's ``tied_parameters``; None when it has none) that
    can be believed against ``stored``, the model entries the checkpoint holds (name -> tensor,
    index entry or shape): those whose canonical name it holds. See [Note: a tie is believed only
    where the checkpoint agrees]. ``where``: the checkpoint, as errors name it.

    Raises:
        CorruptCheckpointError: the record is no mapping of names, or an alias is stored with
            another shape or dtype than its canonical tensor, or (both tensors) other values.
    """
    if recorded is None:
        return {}
    if not isinstance(recorded, Mapping) or not all(
        isinstance(a, str) and isinstance(c, str) and a != c for a, c in recorded.items()
    ):
        raise CorruptCheckpointError(
            f"The checkpoint {where!r} records its tied parameters as a {type(recorded).__name__} that is "
            "not a mapping of parameter names {alias: canonical}. Nothing was read through it. The checkpoint was damaged "
            "or edited after it was written: resume from another checkpoint."
        )
    ties: dict[str, str] = {}
    for alias, canonical in recorded.items():
        if canonical not in stored:
            continue
        problem = _tie_problem(alias, canonical, stored) if alias in stored else None
        if problem is not None:
            raise CorruptCheckpointError(
                f"The checkpoint {where!r} records {alias!r} as tied to {canonical!r} (one tensor under two "
                f"names: tied_parameters), but it stores {problem}, so the two are no tie. Nothing was read "
                "through it. The checkpoint was damaged or edited after it was written: resume from another "
                f"checkpoint (or, if the two are separate tensors, remove {alias!r} from its tied_parameters)."
            )
        ties[alias] = canonical
    return ties


def _tie_problem(alias: str, canonical: str, stored: Mapping[str, Any]) -> str | None:
    """How the stored ``alias`` differs from its ``canonical`` entry, said as the end of "it
    stores ..."; None when they agree."""
    a, c = _described(stored[alias]), _described(stored[canonical])
    if a is None or c is None:
        return f"{alias!r} or {canonical!r} as something other than a tensor"
    if a[0] != c[0] or (a[1] is not None and c[1] is not None and a[1] != c[1]):
        return f"{alias!r} as {_said(a)} and {canonical!r} as {_said(c)}"
    alias_tensor, canonical_tensor = stored[alias], stored[canonical]
    if not isinstance(alias_tensor, torch.Tensor) or not isinstance(canonical_tensor, torch.Tensor):
        return None  # values not at hand: believed on shapes
    if _one_view(alias_tensor, canonical_tensor):
        return None
    if any(
        t.numel() * t.element_size() > t.untyped_storage().nbytes() for t in (alias_tensor, canonical_tensor)
    ):
        # comparing would read every repeated element (10**12 of them, for a forged stride of 0)
        return f"{alias!r} and {canonical!r} as two different views, one repeating its elements"
    if not torch.equal(alias_tensor.detach(), canonical_tensor.detach()):
        return f"{alias!r} with values other than {canonical!r}'s (both {_said(a)})"
    return None


def find_ties(
    weights: Mapping[str, torch.Tensor], recorded: Mapping[str, str] | None = None
) -> dict[str, str]:
    """``{alias: canonical}`` among ``weights``, a model state of whole tensors.

    [Note: finding ties]
    Three signals, in this order: the checkpoint's record (``recorded``, as :func:`checked_ties`
    returned it: the saver saw which parameters are one object, see [Note: tied parameters stored
    once] in io.py); tensors that are one view of one storage (how ``torch.save`` keeps a tie,
    whoever wrote the file); and, only for a checkpoint without a record (written by Lightning or
    an older fullshard, sharded ones by DCP key by key), tensors of the same shape and dtype that
    are exactly equal and not constant. Equal constant tensors (a fresh norm's ones,
    zero-initialised projections) are common without any tie; equal random or trained ones are
    not. The canonical name is the first in the state dict's order, the module's registration
    order: the embedding before the head, the one Hugging Face keeps and re-ties
    ``_tied_weights_keys`` to.
    """
    ties = {a: c for a, c in (recorded or {}).items() if a in weights and c in weights and a != c}
    views: dict[tuple[Any, ...], str] = {}
    for key, tensor in weights.items():
        if key in ties or tensor.numel() == 0:
            continue
        view = (
            tensor.untyped_storage().data_ptr(),
            tensor.storage_offset(),
            tuple(tensor.shape),
            tensor.stride(),
            tensor.dtype,
        )
        if view in views:
            ties[key] = views[view]
        else:
            views[view] = key
    if recorded is None:
        ties.update(_equal_tensors({k: v for k, v in weights.items() if k not in ties}))
    return ties


def _equal_tensors(weights: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """``{alias: canonical}`` for non-constant tensors exactly equal to an earlier one (see
    [Note: finding ties]). A sample of each tensor's elements picks the few pairs compared whole."""
    buckets: dict[tuple[Any, ...], list[str]] = {}
    for key, tensor in weights.items():
        flat = tensor.detach().reshape(-1)
        if flat.numel() < 2:
            continue
        sample = tuple(flat[:: max(1, flat.numel() // 16)][:16].tolist())
        buckets.setdefault((tuple(tensor.shape), tensor.dtype, sample), []).append(key)
    ties: dict[str, str] = {}
    for keys in buckets.values():
        canonicals: list[str] = []
        for key in keys if len(keys) > 1 else ():
            flat = weights[key].detach().reshape(-1)
            if bool((flat == flat[0]).all()):
                continue
            match = next((c for c in canonicals if torch.equal(weights[c], weights[key])), None)
            if match is None:
                canonicals.append(key)
            else:
                ties[key] = match
    return ties
