"""One process on one device: what ``strategy="auto"`` picks when there is a single device."""

from __future__ import annotations

from typing import TYPE_CHECKING

from typing_extensions import override

from fullshard.strategies.strategy import Strategy

if TYPE_CHECKING:
    from fullshard.strategies.registry import StrategyRegistry


class SingleDeviceStrategy(Strategy):
    """Train in this process on one device, with no process group and no wrapper."""

    strategy_name = "single_device"

    @classmethod
    @override
    def register_strategies(cls, registry: StrategyRegistry) -> None:
        registry.register(cls.strategy_name, cls, description="One process on one device (CPU or one GPU).")
