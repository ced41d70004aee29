"""The strategy registry: names users pass as ``Trainer(strategy="...")``.

Each strategy class fills the registry itself through its ``register_strategies`` classmethod;
other packages add strategies through the ``fullshard.strategies`` entry-point group, whose
entries point at a callable taking the registry (usually such a classmethod)::

    [project.entry-points."fullshard.strategies"]
    my_strategy = "my_package.strategy:MyStrategy.register_strategies"
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fullshard.errors import StrategyRegistryError, did_you_mean

if TYPE_CHECKING:
    from fullshard.strategies.strategy import Strategy

ENTRY_POINT_GROUP = "fullshard.strategies"


@dataclass(frozen=True)
class RegisteredStrategy:
    """One registry entry: a class, what it is for, and the keyword arguments a name implies."""

    name: str
    strategy_class: type[Strategy]
    description: str
    init_params: dict[str, Any] = field(default_factory=dict)


class StrategyRegistry:
    """Maps strategy names to classes and the constructor arguments each name stands for."""

    def __init__(self) -> None:
        self._entries: dict[str, RegisteredStrategy] = {}

    def register(
        self,
        name: str,
        strategy_class: type[Strategy],
        description: str = "",
        override: bool = False,
        **init_params: Any,
    ) -> None:
        """Register ``name`` so that ``get(name)`` builds ``strategy_class(**init_params)``.

        Raises:
            StrategyRegistryError: ``name`` is taken and ``override`` is False.
        """
        if name in self._entries and not override:
            taken = self._entries[name].strategy_class.__name__
            raise StrategyRegistryError(
                f"Strategy name {name!r} is already registered (by {taken}). Pick another name, "
                "or pass `override=True` to replace the existing entry."
            )
        self._entries[name] = RegisteredStrategy(name, strategy_class, description, dict(init_params))

    def remove(self, name: str) -> None:
        """Forget ``name``; a missing name is ignored."""
        self._entries.pop(name, None)

    def get(self, name: str, **extra_params: Any) -> Strategy:
        """Build the strategy registered as ``name``; ``extra_params`` override its defaults."""
        entry = self.entry(name)
        return entry.strategy_class(**{**entry.init_params, **extra_params})

    def entry(self, name: str) -> RegisteredStrategy:
        """The registry entry for ``name``.

        Raises:
            StrategyRegistryError: ``name`` is not registered; the message lists the names that are.
        """
        try:
            return self._entries[name]
        except KeyError:
            raise StrategyRegistryError(
                f"Unknown strategy {name!r}.{did_you_mean(name, self.available())} "
                f"Available strategies: {', '.join(self.available())}. "
                "Pass one of these names, a `fullshard.strategies.Strategy` instance, or register "
                "your own with `fullshard.strategies.STRATEGY_REGISTRY.register(...)`."
            ) from None

    def available(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._entries)

    def describe(self) -> dict[str, str]:
        """Name -> description, for listing in help texts."""
        return {name: self._entries[name].description for name in self.available()}

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def load_entry_points(self, group: str = ENTRY_POINT_GROUP) -> list[str]:
        """Call every callable published under the entry-point ``group`` with this registry.

        Returns the names of the entry points loaded.
        """
        loaded = []
        for entry_point in importlib.metadata.entry_points(group=group):
            register = entry_point.load()
            if not callable(register):
                raise StrategyRegistryError(
                    f"Entry point {entry_point.name!r} in group {group!r} points at {entry_point.value!r}, "
                    "which is not callable. It must name a function or classmethod taking the registry, "
                    "such as `my_package.MyStrategy.register_strategies`."
                )
            register(self)
            loaded.append(entry_point.name)
        return loaded
