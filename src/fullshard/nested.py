"""Walking a batch or a result: apply a function to every element of a type inside lists,
tuples, named tuples, mappings and dataclasses, keeping the structure: ``lightning_utilities``'
``apply_to_collection`` (Lightning's), with fullshard's message for a frozen dataclass."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from lightning_utilities.core.apply_func import apply_to_collection as _apply_to_collection


def apply_to_collection(data: Any, dtype: type | tuple[type, ...], function: Callable[..., Any]) -> Any:
    """``data`` with every element that is an instance of ``dtype`` replaced by ``function(element)``.

    Lists, tuples, named tuples and mappings (``dict``, ``OrderedDict``, ``defaultdict``, any
    ``Mapping`` built from pairs) are rebuilt as the same type; a dataclass instance is copied
    (fields not given to ``__init__`` are kept, cached properties are dropped) and its
    ``__init__`` fields replaced. Anything else is returned as it is. A frozen dataclass cannot be
    rebuilt field by field and raises ``ValueError``, saying which class it is and what to do
    (``lightning_utilities``' own message names neither).
    """
    try:
        return _apply_to_collection(data, dtype, function)
    except ValueError as error:
        frozen = error.__cause__
        if not isinstance(frozen, dataclasses.FrozenInstanceError):
            raise
        raise ValueError(
            f"{_frozen_class_name(frozen)} is a frozen dataclass, whose fields cannot be replaced one by one: make it "
            "a plain dataclass (frozen=False); a batch class may instead have a `.to(device)` method that "
            "returns the moved copy."
        ) from frozen


def _frozen_class_name(error: dataclasses.FrozenInstanceError) -> str:
    """The class whose ``__setattr__`` raised ``error`` (the dataclass may sit deep in the batch)."""
    traceback = error.__traceback__
    while traceback is not None and traceback.tb_next is not None:
        traceback = traceback.tb_next
    instance = traceback.tb_frame.f_locals.get("self") if traceback is not None else None
    return type(instance).__name__ if dataclasses.is_dataclass(instance) else "A dataclass in the collection"
