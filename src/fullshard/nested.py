"""Walking a batch or a result: apply a function to every element of a type inside lists,
tuples, named tuples, mappings and dataclasses, keeping the structure (Lightning's
``apply_to_collection``, the form batches and ``all_gather`` results take)."""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def apply_to_collection(data: Any, dtype: type | tuple[type, ...], function: Callable[..., Any]) -> Any:
    """``data`` with every element that is an instance of ``dtype`` replaced by ``function(element)``.

    Lists, tuples, named tuples and mappings (``dict``, ``OrderedDict``, ``defaultdict``, any
    ``Mapping`` built from pairs) are rebuilt as the same type; a dataclass instance is copied
    (fields not given to ``__init__`` are kept, cached properties are dropped) and its
    ``__init__`` fields replaced. Anything else is returned as it is. A frozen dataclass cannot be
    rebuilt field by field and raises ``ValueError``.
    """
    if isinstance(data, dtype):
        return function(data)
    kind = data.__class__
    if kind is list or kind is tuple:  # the common case first: one level, no rebuilding by type
        return kind(apply_to_collection(item, dtype, function) for item in data)
    if kind is dict:
        return {key: apply_to_collection(value, dtype, function) for key, value in data.items()}
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        return _apply_to_dataclass(data, dtype, function)
    if isinstance(data, Mapping):
        pairs = OrderedDict((key, apply_to_collection(value, dtype, function)) for key, value in data.items())
        return kind(data.default_factory, pairs) if isinstance(data, defaultdict) else kind(pairs)
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # a named tuple
        return kind(*(apply_to_collection(item, dtype, function) for item in data))
    if isinstance(data, Sequence) and not isinstance(data, str | bytes):
        return kind([apply_to_collection(item, dtype, function) for item in data])
    return data


def _apply_to_dataclass(data: Any, dtype: type | tuple[type, ...], function: Callable[..., Any]) -> Any:
    fields = [(field.name, getattr(data, field.name), field.init) for field in dataclasses.fields(data)]
    # Copy everything but the fields themselves, which are about to be replaced (or kept as they are).
    result = copy.deepcopy(data, memo={id(value): value for _, value, _ in fields})
    for name, value, init in fields:
        try:
            setattr(result, name, apply_to_collection(value, dtype, function) if init else value)
        except dataclasses.FrozenInstanceError as error:
            raise ValueError(
                f"{type(data).__name__} is a frozen dataclass, whose fields cannot be replaced one by one: make it "
                "a plain dataclass (frozen=False); a batch class may instead have a `.to(device)` method that "
                "returns the moved copy."
            ) from error
    for name, attribute in vars(type(data)).items():
        if isinstance(attribute, functools.cached_property):
            vars(result).pop(name, None)  # computed from the old fields
    return result
