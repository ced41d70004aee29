"""apply_to_collection: the structure kept, every element of the type replaced."""

from __future__ import annotations

import dataclasses
import functools
from collections import OrderedDict, defaultdict, namedtuple

import pytest
import torch

from fullshard.nested import apply_to_collection

Pair = namedtuple("Pair", ["a", "b"])


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    meta: dict[str, object]
    seen: int = dataclasses.field(init=False, default=0)

    @functools.cached_property
    def total(self) -> float:
        return float(self.x.sum())


@dataclasses.dataclass(frozen=True)
class Frozen:
    x: torch.Tensor


def double(t: torch.Tensor) -> torch.Tensor:
    return t * 2


def test_containers_keep_their_types_and_other_values() -> None:
    one = torch.ones(2)
    data = [
        one,
        (one, "text", 3),
        Pair(one, [one]),
        {"k": one, "s": "x"},
        OrderedDict(a=one),
        defaultdict(list, a=one),
        b"bytes",
    ]
    out = apply_to_collection(data, torch.Tensor, double)
    assert type(out) is list and torch.equal(out[0], one * 2)
    assert type(out[1]) is tuple and out[1][1:] == ("text", 3) and torch.equal(out[1][0], one * 2)
    assert type(out[2]) is Pair and torch.equal(out[2].a, one * 2) and torch.equal(out[2].b[0], one * 2)
    assert out[3]["s"] == "x" and torch.equal(out[3]["k"], one * 2)
    assert type(out[4]) is OrderedDict and torch.equal(out[4]["a"], one * 2)
    assert type(out[5]) is defaultdict and out[5].default_factory is list and out[5]["missing"] == []
    assert out[6] == b"bytes"
    assert torch.equal(one, torch.ones(2))  # the input is not changed


def test_dataclass_fields_replaced_on_a_copy() -> None:
    batch = Batch(torch.ones(3), {"id": torch.zeros(1), "name": "a"})
    batch.seen = 5
    assert batch.total == 3.0
    out = apply_to_collection(batch, torch.Tensor, double)
    assert out is not batch and torch.equal(out.x, torch.full((3,), 2.0))
    assert torch.equal(out.meta["id"], torch.zeros(1)) and out.meta["name"] == "a"
    assert out.seen == 5  # a field outside __init__ is kept
    assert out.total == 6.0  # the cached property is computed again from the new fields
    assert torch.equal(batch.x, torch.ones(3))


def test_frozen_dataclass_says_what_to_do() -> None:
    with pytest.raises(ValueError, match=r"Frozen is a frozen dataclass.*frozen=False.*\.to\(device\)"):
        apply_to_collection(Frozen(torch.ones(1)), torch.Tensor, double)


def test_a_frozen_dataclass_deep_in_the_batch_is_named() -> None:
    @dataclasses.dataclass
    class Outer:
        items: list[object]

    with pytest.raises(ValueError, match=r"^Frozen is a frozen dataclass"):
        apply_to_collection({"batch": [Outer([Frozen(torch.ones(1))])]}, torch.Tensor, double)
