"""Modules that a model reaches both inside and outside an FSDP unit, for state dicts.

[Note: a module wrapped by hand and kept under its old name]
Lightning's manual-wrapping guide builds ``linear_layer = wrap(self.linear_layer)`` and puts
the wrapper into ``self.model``, keeping ``self.linear_layer``: one ``Linear`` reachable as
``linear_layer`` (outside the unit) and as ``model.0`` (inside it). Training is unaffected (the
forward goes through the unit), but a state dict is not: outside its unit the module holds
views of this rank's shard, and torch's ``get_model_state_dict`` gives every name of a shared
parameter the tensor of the first name it meets, so both keys came out as flat shards. Such an
*alias* path is detached from its parent while torch reads or writes the state dict, and its
keys are filled in afterwards with the tensors of the path through the unit (as the plain,
unwrapped module's ``state_dict()`` holds the same tensor under both names). A module reached
twice through the same unit (``block.0`` and ``model.2.0`` above) is handled the same way:
loading a full state broadcast from rank 0, torch fills only the first name of a parameter
and then finds the other missing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

_WRAPPER_SEGMENTS = frozenset({"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"})


@dataclass(frozen=True)
class Alias:
    """``parent._modules[name]`` is a module whose state dict keys live under ``target``
    (the path through its FSDP unit); ``prefix`` is the alias path, both without wrapper names."""

    parent: nn.Module
    name: str
    prefix: str
    target: str


def _clean(path: str) -> str:
    return ".".join(p for p in path.split(".") if p and p not in _WRAPPER_SEGMENTS)


def find_aliases(model: nn.Module, unit_class: type[nn.Module]) -> list[Alias]:
    """The alias paths of ``model`` (see [Note: a module wrapped by hand and kept under its old
    name]): every path to a module but one, the first of those through the most ``unit_class``
    wrappers. Only the topmost path of each is listed."""
    reached: dict[int, list[tuple[str, nn.Module, str, int]]] = {}

    def visit(module: nn.Module, path: str, depth: int) -> None:
        for name, child in module._modules.items():
            if child is None:
                continue
            child_depth = depth + isinstance(child, unit_class)
            child_path = f"{path}.{name}" if path else name
            reached.setdefault(id(child), []).append((child_path, module, name, child_depth))
            visit(child, child_path, child_depth)

    visit(model, "", 0)
    aliases: list[Alias] = []
    hidden: list[str] = []
    for paths in reached.values():
        if len(paths) < 2:
            continue
        canonical = max(paths, key=lambda p: p[3])  # the first of the most deeply wrapped
        for path, parent, name, _ in paths:
            if path == canonical[0] or any(path == h or path.startswith(h + ".") for h in hidden):
                continue
            hidden.append(path)
            aliases.append(Alias(parent, name, _clean(path), _clean(canonical[0])))
    return aliases  # a module is listed before its descendants, which its hidden path hides


@contextlib.contextmanager
def detached(aliases: list[Alias]) -> Iterator[None]:
    """The alias paths taken out of their parents for the duration."""
    removed = [(a, a.parent._modules.pop(a.name)) for a in aliases]
    try:
        yield
    finally:
        for alias, module in reversed(removed):
            alias.parent._modules[alias.name] = module


def add_alias_keys(state: dict[str, Any], aliases: list[Alias]) -> dict[str, Any]:
    """``state`` with each alias's keys holding the tensors of its target's."""
    for alias in aliases:
        start = alias.target + "."
        state.update(
            {alias.prefix + "." + k[len(start) :]: v for k, v in list(state.items()) if k.startswith(start)}
        )
    return state


def drop_alias_keys(state: Mapping[str, Any], aliases: list[Alias]) -> dict[str, Any]:
    """``state`` without the aliases' keys (their values are those of the targets' keys)."""
    prefixes = tuple(alias.prefix + "." for alias in aliases)
    return {k: v for k, v in state.items() if not k.startswith(prefixes)}
